"""Data hyper-cleaning table (see README.md here)."""
