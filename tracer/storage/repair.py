"""Repair of damaged trace files, for ``check --repair`` and the uploader.

A file :func:`tracer.storage.files.read_batches` cannot read to its end (or at all: empty, not Arrow) has its
readable batches written to ``<stem>.repaired.arrow`` and is renamed ``<name>.damaged`` (readers skip it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets

import pyarrow as pa

from tracer import schema as S
from tracer.storage.files import FileRead, read_batches
from tracer.storage.writer import fsync_dir

#: Suffix appended to a damaged original once repaired (readers skip it); its readable batches go to REPAIRED_SUFFIX.
DAMAGED_SUFFIX = ".damaged"
REPAIRED_SUFFIX = ".repaired" + S.FILE_SUFFIX

SOUND = "sound"
REPAIRED = "repaired"
LEFT = "left"


@dataclasses.dataclass
class RepairResult:
    """What :func:`repair_file` did: ``action`` is ``"sound"``, ``"repaired"`` or ``"left"`` (untouched, see
    ``read.skipped``); ``repaired_to`` and ``damaged_to`` are "" when nothing went there."""

    path: str
    action: str
    read: FileRead
    repaired_to: str = ""
    damaged_to: str = ""

    @property
    def kept_batches(self) -> int:
        """Batches of the original now readable under ``repaired_to``."""
        return self.read.batches if self.action == REPAIRED else 0


def repair_file(path: str | os.PathLike[str]) -> RepairResult:
    """Repair one local trace file (see the module docstring); never deletes anything."""
    file = os.fspath(path)
    reading = read_batches(file)
    target = file.removesuffix(S.FILE_SUFFIX) + REPAIRED_SUFFIX  # x.arrow -> x.repaired.arrow
    tmp = f"{target}.tmp-{secrets.token_hex(4)}"
    try:
        with contextlib.ExitStack() as opened:
            writer = None
            for batch, custom in reading.with_metadata():
                if writer is None:
                    sink = opened.enter_context(open(tmp, "wb"))
                    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", 3))
                    writer = opened.enter_context(pa.ipc.new_stream(sink, reading.schema, options=options))
                writer.write_batch(batch, custom_metadata=custom)
            result = reading.result
            if result.sound or (result.skipped and not result.repairable):
                return RepairResult(file, SOUND if result.sound else LEFT, result)
            out = RepairResult(file, REPAIRED, result, damaged_to=file + DAMAGED_SUFFIX)
            if writer is not None:
                writer.close()
                sink.flush()
                os.fsync(sink.fileno())
                os.replace(tmp, target)
                out.repaired_to = target
        os.replace(file, out.damaged_to)
        fsync_dir(os.path.dirname(file) or ".")
        return out
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
