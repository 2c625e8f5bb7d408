"""The framework version, stamped into checkpoints and `nitro --version`."""

__version__ = "0.1.0"
