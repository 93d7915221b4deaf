"""LIBSVM regularization tables, paper Tables 7-2 to 7-4 (see README.md here)."""
