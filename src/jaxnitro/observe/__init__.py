"""Observability: phases, reports."""
