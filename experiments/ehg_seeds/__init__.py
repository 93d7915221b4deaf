"""EHG across training seeds on Omniglot (see README.md)."""
