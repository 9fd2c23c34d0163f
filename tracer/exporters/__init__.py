"""Exporters: ship trace files (or live batches) to MLflow, WandB, SwanLab, OTLP, the console.

A backend is a :class:`~tracer.exporters.base.Sink` registered in :data:`tracer.backends.BACKENDS`, fed by
:class:`~tracer.exporters.base.LiveDriver` (``tracer.init(backend=...)``) or :func:`export_files` (``rollout-trace
export``). Importing this package imports no backend library.
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
