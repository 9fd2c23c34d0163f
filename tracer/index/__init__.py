"""Derived data above the trajectory model: shard indexes, the run rollup, and the readers that use them.

:mod:`tracer.index.shard` (each closed shard's index) and :mod:`tracer.index.rollup` (a run's
shard indexes merged) are file formats and their checked readers; :mod:`tracer.index.closed` writes
them when a shard closes; :mod:`tracer.index.readers` answers trajectory rows and per-step
aggregates from them. Nothing here is imported by this package's ``__init__``: :mod:`tracer.read`
imports the formats, which import nothing of the model.
"""
