"""Derived data above the trajectory model: shard indexes, the run rollup, and the readers that use them."""
