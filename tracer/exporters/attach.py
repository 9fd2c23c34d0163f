"""Live exporters: attach the backends a config names to a recorder.

The local Arrow files are written by the recorder itself; every other backend
named in ``TraceConfig.backend`` gets an exporter object from the registry in
:mod:`tracer.exporters.registry`, fed with each batch after it is durable on disk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracer.config import LOCAL_BACKEND
from tracer.exporters.registry import BACKENDS, load_backend

if TYPE_CHECKING:
    from tracer.record.recorder import Recorder


def attach_exporters(rec: Recorder) -> None:
    """Create the live exporters for ``rec.config`` and subscribe them to its batches."""
    for name in rec.config.backends:
        if name == LOCAL_BACKEND or BACKENDS.get(name) is None:
            continue
        exporter = load_backend(name)(rec.config)
        rec.add_listener(exporter.export)
        rec.add_closer(exporter.shutdown)
        if hasattr(exporter, "flush"):
            rec.add_flusher(exporter.flush)
