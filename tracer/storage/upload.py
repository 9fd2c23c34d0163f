"""Staging and upload: ``output_dir`` on object storage or a remote filesystem (:mod:`tracer.storage.uri`).

The recorder writes into a local staging directory; :class:`UploadingSpanWriter` uploads each file once it is
closed (one PUT on S3 and GCS, else a ``.partial-<nonce>`` name then a rename). A writer that starts, or
``rollout-trace upload``, repairs and uploads the files whose ``<stem>.lock`` nobody holds.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable

import pyarrow as pa
import pyarrow.fs as pafs

from tracer import schema as S
from tracer.storage.files import write_replacing
from tracer.storage.repair import REPAIRED, SOUND, repair_file
from tracer.storage.uri import filesystem, join_uri, strip_query
from tracer.storage.writer import SpanWriter

logger = logging.getLogger("rollout_trace")

#: Environment variable: root of the staging directories; on a disk that survives a restart, the next run uploads
#: what a crash left.
ENV_STAGING_DIR = "ROLLOUT_TRACE_STAGING_DIR"
#: File in each staging directory naming the URI its files go to.
DESTINATION_FILE = "DESTINATION"
LOCK_SUFFIX = ".lock"
#: Marker in the name of an upload not yet renamed to its final name.
PARTIAL_MARK = ".partial-"
#: Filesystems on which one PUT makes the whole object appear at once.
ATOMIC_PUT_FILESYSTEMS = ("s3", "gcs")
UPLOAD_CHUNK_BYTES = 8 * 1024 * 1024
MAX_RETRY_S = 60.0


def staging_root() -> str:
    """The root of staging directories (:data:`ENV_STAGING_DIR` or ``<tempdir>/rollout_trace_staging``)."""
    return os.environ.get(ENV_STAGING_DIR) or os.path.join(tempfile.gettempdir(), "rollout_trace_staging")


def staging_dir_for(dest_uri: str, root: str | None = None) -> str:
    """The local staging directory of the run that uploads to ``dest_uri``: same URI, same directory."""
    readable = re.sub(r"[^A-Za-z0-9.-]+", "_", strip_query(dest_uri))[-80:].strip("_")
    digest = hashlib.sha256(dest_uri.encode()).hexdigest()[:12]
    return os.path.join(root or staging_root(), f"{readable}-{digest}")


def _stem_of(name: str) -> str:  # host_pid_start_nonce_0003.arrow -> host_pid_start_nonce
    return name[: -len(S.FILE_SUFFIX)].rsplit("_", 1)[0]


def _try_lock(path: str) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


class NotUploadableError(Exception):
    """A staged file that is not a trace file this writer can repair (kept in staging)."""


def prepare_for_upload(path: str) -> str | None:
    """Repair a staged file a writer may have left torn; the file to upload, or None if nothing is readable. Raises
    NotUploadableError for a file not to repair or upload (it stays in staging)."""
    result = repair_file(path)
    if result.action == SOUND:
        return path
    if result.action == REPAIRED:
        if result.repaired_to:
            logger.warning(
                "rollout-trace: %s was damaged; uploading its %d readable batch(es), original kept as %s",
                path,
                result.kept_batches,
                result.damaged_to,
            )
        return result.repaired_to or None
    raise NotUploadableError(result.read.describe())


def upload_file(local: str, dest_uri: str) -> str:
    """Upload one closed trace file into the prefix ``dest_uri``, whole or not at all, then remove it; its URI."""
    name = os.path.basename(local)
    final_uri = join_uri(dest_uri, name)
    fs, final = filesystem(final_uri)
    atomic = fs.type_name in ATOMIC_PUT_FILESYSTEMS
    if not atomic:
        fs.create_dir(final.rpartition("/")[0], recursive=True)
    target = final if atomic else f"{final}{PARTIAL_MARK}{secrets.token_hex(4)}"
    size = os.path.getsize(local)
    with open(local, "rb") as src, fs.open_output_stream(target) as dst:
        shutil.copyfileobj(src, dst, UPLOAD_CHUNK_BYTES)
    if not atomic:
        fs.move(target, final)
    info = fs.get_file_info(final)
    if info.type != pafs.FileType.File or info.size != size:
        raise OSError(f"upload of {local} to {final_uri} left {info.size} bytes, expected {size}")
    os.remove(local)
    return final_uri


def claim_orphans(staging: str, own_stem: str | None = None) -> tuple[list[str], dict[str, int]]:
    """Files in ``staging`` whose writer is gone, and the lock fds now held for them."""
    try:
        names = sorted(os.listdir(staging))
    except FileNotFoundError:
        return [], {}
    stems: dict[str, list[str]] = collections.defaultdict(list)
    for name in names:
        if name.endswith(S.FILE_SUFFIX):
            stems[_stem_of(name)].append(os.path.join(staging, name))
        elif name.endswith(LOCK_SUFFIX):
            stems.setdefault(name.removesuffix(LOCK_SUFFIX), [])
    files: list[str] = []
    locks: dict[str, int] = {}
    for stem, paths in stems.items():
        fd = None if stem == own_stem else _try_lock(os.path.join(staging, stem + LOCK_SUFFIX))
        if fd is not None and not paths:
            _release(staging, stem, fd)
        elif fd is not None:  # its writer is gone
            locks[stem] = fd
            files.extend(paths)
    return files, locks


def _release(staging: str, stem: str, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.remove(os.path.join(staging, stem + LOCK_SUFFIX))
    os.close(fd)


def recover(staging: str, dest_uri: str | None = None) -> tuple[list[str], list[str]]:
    """Upload what dead writers left in ``staging``; return (uploaded URIs, failures)."""
    if dest_uri is None:
        with open(os.path.join(staging, DESTINATION_FILE), encoding="utf-8") as f:
            dest_uri = f.read().strip()
    files, locks = claim_orphans(staging)
    uploaded, failed = [], []
    try:
        for path in files:
            try:
                ready = prepare_for_upload(path)
                if ready is not None:
                    uploaded.append(upload_file(ready, dest_uri))
            except Exception as exc:
                failed.append(f"{path}: {type(exc).__name__}: {exc}")
    finally:
        for stem, fd in locks.items():
            if any(_stem_of(n) == stem for n in os.listdir(staging) if n.endswith(S.FILE_SUFFIX)):
                os.close(fd)
            else:
                _release(staging, stem, fd)
    return uploaded, failed


def _close_at_exit(ref: weakref.ref[UploadingSpanWriter]) -> None:
    writer = ref()
    if writer is None or writer._pid != os.getpid():
        return  # a forked child must not close (and so corrupt) its parent's file
    try:
        (writer.at_exit or writer.close)()  # the owner flushes what it buffers, then closes this writer
    except Exception as exc:  # never fail interpreter exit
        logger.warning("rollout-trace: uploading at exit failed: %s (files stay in %s)", exc, writer.run_dir)


class UploadingSpanWriter(SpanWriter):
    """A :class:`SpanWriter` into a staging directory that uploads each closed file (``upload_interval_s`` old at most)
    to ``dest_uri``; ``report(kind, detail, exc)`` gets problems; ``at_exit`` replaces :meth:`close` at exit."""

    def __init__(
        self,
        dest_uri: str,
        metadata: dict[str, str],
        compression_level: int = 3,
        max_file_bytes: int = 256 * 1024 * 1024,
        upload_interval_s: float = 60.0,
        report: Callable[[str, str, BaseException | None], None] | None = None,
        at_exit: Callable[[], object] | None = None,
    ) -> None:
        staging = staging_dir_for(dest_uri)
        super().__init__(staging, metadata, compression_level, max_file_bytes, on_close=None)  # no index: remote
        self.dest_uri = dest_uri
        self._pid = os.getpid()
        self.upload_interval_s = float(upload_interval_s)
        self._report = report or (lambda kind, detail, exc: None)
        self.at_exit = at_exit
        self._lock = threading.RLock()
        self._upload_lock = threading.Lock()
        self._in_write = False
        self._opened_at = 0.0
        #: (local path, needs repair check, not before monotonic time, attempts)
        self._pending: collections.deque[tuple[str, bool, float, int]] = collections.deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        os.makedirs(staging, exist_ok=True)
        path = os.path.join(staging, DESTINATION_FILE)
        write_replacing(path, f"{path}.{secrets.token_hex(4)}", lambda f: f.write(dest_uri.encode() + b"\n"))
        try:
            filesystem(join_uri(dest_uri, "x"))  # a bad URI fails here, not at the first upload
        except (ValueError, TypeError, pa.ArrowInvalid):
            raise
        except Exception as exc:  # unreachable now: uploads retry later
            self._report("upload failed", f"cannot reach {dest_uri}: {type(exc).__name__}: {exc}", exc)
        # pyarrow finalizes S3 at exit; upload before that (atexit runs handlers last-in first-out).
        atexit.register(_close_at_exit, weakref.ref(self))
        self._lock_fd: int | None = _try_lock(os.path.join(staging, self._stem + LOCK_SUFFIX))
        orphans, self._orphan_locks = claim_orphans(staging, self._stem)
        self._pending.extend((path, True, 0.0, 0) for path in orphans)
        if orphans:
            self._start()

    def _open(self) -> None:
        if self._lock_fd is None:
            self._lock_fd = _try_lock(os.path.join(self.run_dir, self._stem + LOCK_SUFFIX))
        super()._open()
        self._opened_at = time.monotonic()
        self._start()

    def write(self, batch: pa.RecordBatch, batch_metadata: dict[str, str] | None = None) -> None:
        """Append ``batch`` durably to the staged file; close it for upload when big or old enough."""
        with self._lock:
            self._in_write = True
            try:
                super().write(batch, batch_metadata)
            finally:
                self._in_write = False
            self._rotate(old_only=True)

    def _abandon(self) -> None:
        path = self.path
        super()._abandon()
        if path is not None:
            self._pending.append((path, True, 0.0, 0))

    def close(self) -> None:
        """Close the current file; from outside a write (shutdown), also upload everything now."""
        with self._lock:
            self._rotate()
            if self._in_write:
                return
            self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None
        self._drain(retry=False)
        self._stopping = False
        if not self._pending and self._lock_fd is not None:
            _release(self.run_dir, self._stem, self._lock_fd)
            self._lock_fd = None

    def _rotate(self, old_only: bool = False) -> None:
        if self._stream is None or (old_only and time.monotonic() - self._opened_at < self.upload_interval_s):
            return
        path = self.path
        SpanWriter.close(self)
        if path is not None:
            self._pending.append((path, False, 0.0, 0))
            self._wake.set()

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="rollout-trace-upload", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(timeout=min(self.upload_interval_s, 1.0))
            self._wake.clear()
            if self._stopping:
                return
            with self._lock:
                self._rotate(old_only=True)
            self._drain(retry=True)

    def _drain(self, retry: bool) -> None:
        with self._upload_lock:
            later: list[tuple[str, bool, float, int]] = []
            while self._pending:
                path, check, not_before, attempts = self._pending.popleft()
                if retry and time.monotonic() < not_before:
                    later.append((path, check, not_before, attempts))
                    continue
                if not os.path.exists(path):
                    continue  # another process recovered it first
                try:
                    ready = prepare_for_upload(path) if check else path
                    if ready is not None:
                        upload_file(ready, self.dest_uri)
                except NotUploadableError as exc:
                    self._report("upload failed", f"{path} kept in staging, not uploaded: {exc}", exc)
                except Exception as exc:
                    attempts += 1
                    self._report(
                        "upload failed",
                        f"{path} -> {self.dest_uri} (attempt {attempts}; kept in staging, retried): "
                        f"{type(exc).__name__}: {exc}",
                        exc,
                    )
                    later.append((path, check, time.monotonic() + min(MAX_RETRY_S, 2.0**attempts), attempts))
            self._pending.extend(later)
            waiting = {_stem_of(os.path.basename(p)) for p, *_ in tuple(self._pending)}
            for stem in [s for s in self._orphan_locks if s not in waiting]:
                _release(self.run_dir, stem, self._orphan_locks.pop(stem))
