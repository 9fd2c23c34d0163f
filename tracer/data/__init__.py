"""Traces as data, read through :mod:`tracer.summary`: training datasets, re-scoring, per-token stats."""
