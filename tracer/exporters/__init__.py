"""Exporters: a :class:`~tracer.exporters.base.Sink` per backend of :data:`tracer.backends.BACKENDS`, fed live by
:class:`~tracer.exporters.base.LiveDriver` or from the files by :func:`export_files`. Imports no backend library."""

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
