"""fewshot: few-shot meta-learning with ensemble hypergradients (EHG)."""

__version__ = "0.1.0"
