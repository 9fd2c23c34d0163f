"""Traces as data: training datasets (:mod:`tracer.data.dataset`) and re-scoring (:mod:`tracer.data.rescore`).

Both read trajectories through :mod:`tracer.summary`, the one trajectory model.
"""

from __future__ import annotations
