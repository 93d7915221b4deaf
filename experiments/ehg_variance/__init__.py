"""Meta-gradient variance of the U-split average (see README.md here)."""
