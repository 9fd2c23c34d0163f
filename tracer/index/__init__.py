"""Derived data above the trajectory model: shard indexes, the run rollup, and the readers that use them.

:mod:`tracer.index.shard` and :mod:`tracer.index.rollup` are file formats and their checked readers (they import
nothing of the model); :mod:`tracer.index.closed` writes them; :mod:`tracer.index.readers` answers from them.
"""
