"""Data: the source protocol, the Grain adapter, prefetch streams, padding, readers."""
