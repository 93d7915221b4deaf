"""Seeded test episodes, accuracy with its 95% CI, statistics and learning-curve plots."""
