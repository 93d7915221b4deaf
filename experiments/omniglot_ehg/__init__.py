"""EHG on Omniglot, U = 1 against U = 5 (see README.md here)."""
