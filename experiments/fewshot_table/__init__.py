"""The paper's miniImageNet / tieredImageNet few-shot table (see README.md here)."""
