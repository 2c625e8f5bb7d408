"""Compiled programs and the module-level compile cache."""
