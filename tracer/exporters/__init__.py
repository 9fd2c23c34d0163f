"""Exporters: ship trace files (or live batches) to MLflow, WandB, SwanLab, the console.

A backend is a :class:`~tracer.exporters.base.Sink` (the wire: open a run's
destination, write one step's trajectories, close, read back) registered in
:data:`tracer.backends.BACKENDS` with its options. Two drivers feed
every sink: :class:`~tracer.exporters.base.LiveDriver` from the recorder
(``tracer.init(backend=...)``) and :func:`export_files` from trace files
(``rollout-trace export PATH --to NAME``).

Importing this package imports no backend library.
"""

from __future__ import annotations

from tracer.backends import BACKENDS, Backend, ExportOptionError, Option, available_backends
from tracer.exporters.base import (
    Driver,
    ExportReport,
    ReadBack,
    Sink,
    SinkBase,
    StepBatch,
    Target,
    Trajectory,
    VerifyResult,
    Written,
    export_files,
)

__all__ = [
    "BACKENDS",
    "Backend",
    "Driver",
    "ExportOptionError",
    "ExportReport",
    "Option",
    "ReadBack",
    "Sink",
    "SinkBase",
    "StepBatch",
    "Target",
    "Trajectory",
    "VerifyResult",
    "Written",
    "available_backends",
    "export_files",
]
