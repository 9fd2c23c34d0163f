"""Derived data above the trajectory model: shard indexes (:mod:`tracer.index.shard`), the run rollup
(:mod:`tracer.index.rollup`), what a closing shard writes (:mod:`tracer.index.closed`) and the readers that use
them (:mod:`tracer.index.readers`)."""
