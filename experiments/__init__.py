"""One folder per study or table; run a driver from the repository root as
`python -m experiments.STUDY.DRIVER` (see experiments/README.md)."""
