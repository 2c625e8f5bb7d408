"""Checkpoints: the record format, the checkpointer and its manifest."""
