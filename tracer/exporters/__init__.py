"""Exporters: ship trace files (or live batches) to MLflow, WandB, SwanLab, the console.

Every backend module ``tracer.exporters.<name>`` provides:

- a live exporter class registered in :data:`tracer.exporters.registry.BACKENDS`
  (``"name": "tracer.exporters.<name>:<Class>"``), built as
  ``Class(config: TraceConfig)``, with ``export(batch: pyarrow.RecordBatch)``
  (called on the writer thread after each durable batch: it must only queue
  work, never block) and ``shutdown(timeout: float | None)`` (drain, then stop);
- ``export_files(path, **options) -> ExportReport`` for post-hoc export.

Importing this package imports no backend library.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


class LiveExporter(Protocol):
    """What the recorder needs from a live backend."""

    def export(self, batch: Any) -> None:
        """Queue a durable batch of spans for shipping; never block."""

    def shutdown(self, timeout: float | None) -> None:
        """Ship what is queued (up to ``timeout`` seconds), then stop."""


@dataclasses.dataclass
class ExportReport:
    """What an export sent and skipped.

    Attributes:
        backend: Backend name.
        trajectories_sent: Trajectories written to the backend.
        trajectories_skipped: Trajectories not sent (already there, filtered, failed).
        spans_sent: Spans written.
        details: Human-readable notes (where to look, why things were skipped).
    """

    backend: str
    trajectories_sent: int = 0
    trajectories_skipped: int = 0
    spans_sent: int = 0
    details: list[str] = dataclasses.field(default_factory=list)
