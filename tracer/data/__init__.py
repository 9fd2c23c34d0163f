"""Traces as data: training datasets (`dataset`), re-scoring (`rescore`), per-token stats (`token_stats_reader`).

They read trajectories through :mod:`tracer.summary`, the one trajectory model.
"""

from __future__ import annotations
