"""SpanWriter: zstd-compressed Arrow IPC files, fsync'd per batch, rotated by size.

Files are ``{run_dir}/{host}_{pid}_{start}_{nonce}_{seq}.arrow`` IPC *files* (format version 2; version 1 wrote
streams), so writers never collide. An open file's writer holds its ``flock``, which the kernel drops however the
process ends: how :mod:`tracer.storage.seal` tells a dead writer.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from tracer import schema as S

#: Called with a file's path once the file is closed cleanly (footer written, fsync'd).
OnClose = Callable[[str], object]


def host_label() -> str:
    """This host's name as it appears in file names (safe characters only)."""
    return re.sub(r"[^A-Za-z0-9.-]+", "-", socket.gethostname())[:64] or "host"


def file_meta(config: dict[str, Any], project: str, experiment: str, sampling: Any = None) -> dict[str, str]:
    """A new run file's metadata: schema version, config, project, experiment, host, pid, creation time."""
    return {
        S.META_SCHEMA_VERSION: S.SCHEMA_VERSION,
        S.META_CONFIG: json.dumps(config),
        S.META_PROJECT: project,
        S.META_EXPERIMENT: experiment,
        S.META_HOST: socket.gethostname(),
        S.META_PID: str(os.getpid()),
        S.META_CREATED_NS: str(time.time_ns()),
        **({S.META_SAMPLING: json.dumps(sampling)} if sampling is not None else {}),
    }


def fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class SpanWriter:
    """Appends span batches to files in ``run_dir``, a new one past ``max_file_bytes``; ``on_close`` gets each one."""

    def __init__(
        self,
        run_dir: str,
        metadata: dict[str, str],
        compression_level: int = 3,
        max_file_bytes: int = 256 * 1024 * 1024,
        on_close: OnClose | None = None,
    ) -> None:
        self.run_dir = run_dir
        self._on_close = on_close
        self.schema = S.SPAN_SCHEMA.with_metadata(metadata)
        self.options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level))
        self.max_file_bytes = max_file_bytes
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self._stem = f"{host_label()}_{os.getpid()}_{stamp}_{secrets.token_hex(4)}"
        self._seq = 0
        self._batches = 0
        self._file: Any = None
        self._stream: pa.ipc.RecordBatchFileWriter | None = None
        self.path: str | None = None
        self.paths: list[str] = []

    def _open(self) -> None:
        self._batches = 0
        self.path = None
        os.makedirs(self.run_dir, exist_ok=True)
        self.path = os.path.join(self.run_dir, f"{self._stem}_{self._seq:04d}{S.FILE_SUFFIX}")
        self._seq += 1
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed in _close
        self.paths.append(self.path)
        # Held until the file is closed: readers seal it only once it is gone (else by pid and age).
        with contextlib.suppress(OSError):
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._stream = pa.ipc.new_file(self._file, self.schema, options=self.options)
        self._file.flush()
        os.fsync(self._file.fileno())
        fsync_dir(self.run_dir)

    def write(self, batch: pa.RecordBatch, batch_metadata: dict[str, str] | None = None) -> None:
        """Append ``batch`` durably; on failure the file is abandoned as it is (the next call starts a new one)."""
        with contextlib.suppress(OSError, ValueError):  # the file grew behind our back: sealed as a dead writer's
            if self._stream is not None and os.fstat(self._file.fileno()).st_size != self._file.tell():
                self._let_go()  # its batches stay as sealed
        try:
            if self._stream is None:
                self._open()
            assert self._stream is not None
            self._stream.write_batch(batch, custom_metadata=batch_metadata)
            self._file.flush()
            os.fsync(self._file.fileno())
        except BaseException:
            self._abandon()
            raise
        self._batches += 1
        if self._file.tell() >= self.max_file_bytes:
            self.close()

    def _let_go(self) -> None:
        with contextlib.suppress(Exception):
            if self._file is not None:
                self._file.close()
        self._file = None
        self._stream = None

    def _abandon(self) -> None:
        self._let_go()
        # A file with no complete batch holds nothing; left behind, it would only make every reader warn.
        if self._batches == 0 and self.path is not None:
            with contextlib.suppress(OSError, ValueError):
                os.remove(self.path)
                self.paths.remove(self.path)

    def close(self) -> None:
        """End the current file cleanly (footer, fsync, unlock), then ``on_close`` (whose failure is ignored)."""
        if self._stream is None:
            return
        try:
            self._stream.close()
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._let_go()
        if self._on_close is not None and self.path is not None:
            with contextlib.suppress(Exception):  # derived data only: the file and its spans are whole
                self._on_close(self.path)
