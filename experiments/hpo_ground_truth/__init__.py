"""Hypergradient lambda paths against the cvxpy ground truth, Fig. 7-3 (see README.md here)."""
