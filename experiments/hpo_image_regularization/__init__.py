"""Per-parameter L2 regularization of image classifiers, Table 7-5 (see README.md here)."""
