"""Sealing: closing a shard whose writer is gone (``ray.shutdown()``, ``os._exit``, SIGKILL).

The writer is gone when, on this host, nobody holds the file's ``flock`` (or the pid in its name no longer
runs); on another host, when the file has not changed for :data:`SEAL_AFTER_S` (a quiet writer then starts a new
file). Sealing appends, under the ``flock``, exactly what pyarrow writes at close after the last complete batch
and changes nothing written; a file torn inside a batch is left to ``rollout-trace check --repair``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import os
import re
import stat
import time

import pyarrow as pa

from tracer import schema as S
from tracer.storage.files import ARROW_FILE_MAGIC, EOS_MARKER, ends_closed, footer_for, read_layout
from tracer.storage.uri import is_remote
from tracer.storage.writer import OnClose, host_label

#: Environment variable: seconds a shard of another host must stay unchanged before it is sealed.
ENV_SEAL_AFTER_S = "ROLLOUT_TRACE_SEAL_AFTER_S"
#: Default for :data:`ENV_SEAL_AFTER_S`: longer than any quiet spell of a live writer (a training step).
SEAL_AFTER_S = 6 * 3600.0
#: ``{host}_{pid}_{start}_{nonce}_{seq}.arrow``, as :class:`tracer.storage.writer.SpanWriter` names its files.
SHARD_NAME = re.compile(
    r"^(?P<host>[A-Za-z0-9.-]+)_(?P<pid>\d+)_(?P<start>\d{8}T\d{6})_(?P<nonce>[0-9a-f]+)_(?P<seq>\d+)"
    + re.escape(S.FILE_SUFFIX)
    + "$"
)

SEALED = "sealed"
ALREADY_CLOSED = "closed"
LIVE = "live"
NOT_SEALED = "not sealed"

CLOSED_CACHE_ENTRIES = 65536


@dataclasses.dataclass
class SealResult:
    """What :func:`seal_if_abandoned` did: ``action`` is ``"sealed"``, ``"closed"`` (already), ``"live"`` or
    ``"not sealed"``; ``why`` is one sentence for a report."""

    path: str
    action: str
    why: str = ""


@functools.lru_cache(maxsize=CLOSED_CACHE_ENTRIES)
def _ends_closed(file: str, stamp: tuple[int, int, int]) -> bool:
    """:func:`ends_closed` once per (size, mtime, inode) of ``file``: while they stay, it is not opened again."""
    return ends_closed(file)


def seal_after_s() -> float:
    """:data:`ENV_SEAL_AFTER_S` when set to a number, else :data:`SEAL_AFTER_S`."""
    try:
        return float(os.environ.get(ENV_SEAL_AFTER_S) or SEAL_AFTER_S)
    except ValueError:
        return SEAL_AFTER_S


def _writer_gone(path: str, fd: int, file_format: bool, max_age_s: float) -> str:
    """Why the writer of ``path`` is gone ("" while it may still write). Takes ``fd``'s lock when it can."""
    locks = True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return ""  # a writer (or another sealer) holds it
    except OSError:
        locks = False  # no flock on this filesystem
    age = time.time() - os.fstat(fd).st_mtime
    name = SHARD_NAME.match(os.path.basename(path))
    if name is not None and name["host"] == host_label():
        if locks and file_format:
            return "its writer no longer holds the file's lock"
        try:
            os.kill(int(name["pid"]), 0)
        except ProcessLookupError:
            return f"process {name['pid']} that wrote it no longer runs"
        except OSError:  # another user's process, among others
            pass
    if age >= max_age_s:
        return f"unchanged for {age:.0f} s (sealed after {max_age_s:g} s)"
    return ""


def seal_if_abandoned(
    path: str | os.PathLike[str], max_age_s: float | None = None, on_sealed: OnClose | None = None
) -> SealResult:
    """Close the local ``path`` as its writer would have if that writer is gone; never raises for the file's sake.
    ``max_age_s`` overrides :func:`seal_after_s`; ``on_sealed`` gets the path of a shard this call sealed."""
    result = _seal(os.fspath(path), max_age_s)
    if on_sealed is not None and result.action == SEALED:
        with contextlib.suppress(Exception):  # derived data only: the seal stands
            on_sealed(result.path)
    return result


def _seal(file: str, max_age_s: float | None) -> SealResult:
    if is_remote(file):
        return SealResult(file, NOT_SEALED, "a remote object (sealed where it was written)")
    try:
        st = os.lstat(file)
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the first open
            return SealResult(file, NOT_SEALED, "not a regular file")
    except OSError as exc:
        return SealResult(file, NOT_SEALED, str(exc))
    if _ends_closed(file, (st.st_size, st.st_mtime_ns, st.st_ino)):
        return SealResult(file, ALREADY_CLOSED)
    limit = seal_after_s() if max_age_s is None else max_age_s
    try:
        fd = os.open(file, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        why = "not writable here" if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM) else str(exc)
        return SealResult(file, NOT_SEALED, why)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return SealResult(file, NOT_SEALED, "not a regular file")
        file_format = os.pread(fd, len(ARROW_FILE_MAGIC), 0) == ARROW_FILE_MAGIC
        gone = _writer_gone(file, fd, file_format, limit)
        if not gone:
            return SealResult(file, LIVE, "its writer may still be writing it")
        # Under the lock now: walk it again, another sealer may have been first.
        if ends_closed(file):
            return SealResult(file, ALREADY_CLOSED)
        layout = read_layout(file)
        if not layout.schema_message:
            return SealResult(file, NOT_SEALED, "no complete schema (empty or not Arrow): check --repair sets it aside")
        if layout.stop or layout.at_eos or layout.end != layout.size:
            why = layout.stop or "bytes after its last complete batch"
            return SealResult(file, NOT_SEALED, f"torn ({why}): rollout-trace check --repair recovers it")
        if layout.file_format and layout.dictionaries:
            return SealResult(file, NOT_SEALED, "holds dictionary batches, which sealing does not list")
        tail = footer_for(layout) if layout.file_format else EOS_MARKER
        written = 0
        while written < len(tail):
            written += os.pwrite(fd, tail[written:], layout.size + written)
        os.fsync(fd)
        return SealResult(file, SEALED, gone)
    except (OSError, ValueError, pa.ArrowException) as exc:
        return SealResult(file, NOT_SEALED, f"{type(exc).__name__}: {exc}")
    finally:
        os.close(fd)  # releases the lock


__all__ = ["ENV_SEAL_AFTER_S", "SEAL_AFTER_S", "SealResult", "seal_if_abandoned"]
