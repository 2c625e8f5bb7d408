"""Logging: the duck-typed logger protocol and the JSON-lines default."""
