"""Episodic meta-training: settings, the trainer and its resumable state, checkpoints."""
