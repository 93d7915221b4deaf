"""Sweeps: a spec (YAML) of training arms expanded to `fewshot` jobs, run by an executor,
resumed from their run folders, and reported with statistics across training seeds."""
