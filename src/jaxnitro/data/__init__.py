"""Data: the source protocol the loop iterates, padding, and file readers."""
