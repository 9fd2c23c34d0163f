"""The run rollup: every closed shard's index of a run directory merged into one file, ``_steps.rollup``.

An uncompressed Arrow IPC file of :data:`tracer.schema.ROLLUP_SCHEMA` (merged partials with their value metrics);
its metadata (:data:`META_ROLLUP`, JSON) names the covered files (size, mtime, inode), their steps, rows, span
names, trace id ranges and whether any holds keyed rewards. Readers use it only when it covers exactly the files
as they are now. Whoever closes a file updates it under ``_steps.rollup.lock``: new files sharing no trajectory
with the covered ones are merged in, else it is rebuilt from every closed, indexed file.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import orjson
import pyarrow as pa

from tracer import schema as S
from tracer.index.shard import ShardIndex, cached, checked_table, load_shard_index, stored_step_partials
from tracer.storage import side_files
from tracer.storage.files import write_replacing
from tracer.storage.index import listing
from tracer.storage.locks import exclusive_within
from tracer.storage.writer import fsync_dir
from tracer.summary import merge_step_partials, with_value_metrics

#: The rollup's file name in its run directory (not a trace file: readers list ``*.arrow`` only).
ROLLUP_NAME = "_steps.rollup"
#: The lock updates hold (created beside it; never deleted).
LOCK_NAME = ROLLUP_NAME + ".lock"
#: Bumped when the layout changes; a rollup of another version is ignored (and rebuilt at the next update).
ROLLUP_VERSION = 1
#: Schema metadata key of the rollup's description (JSON).
META_ROLLUP = "rollout_trace.rollup"
#: How long an update waits for another process's update to end before it leaves the rollup as it is.
LOCK_WAIT_S = 2.0
#: Parsed rollups a process keeps (by path and the file's stat).
CACHE_ENTRIES = 64

#: ``(size, mtime_ns, inode)`` of a file.
Stamp = tuple[int, int, int]
#: The exact per-step aggregates of some files (:func:`tracer.index.readers.read_step_partials`, passed in).
PartialsOfFiles = Callable[[list[str]], pa.Table]


@dataclasses.dataclass
class Rollup:
    """A run directory's rollup as read: covered file names and stamps, their merged partials
    (:data:`tracer.schema.ROLLUP_SCHEMA`; None until :meth:`table` reads ``path``), their steps ascending, span
    rows, span names (None: an index did not list them), per file the trace id range (None: no trajectory),
    and ``keyed``: whether a file may hold keyed rewards (or its index does not say)."""

    files: dict[str, Stamp]
    partials: pa.Table | None
    steps: list[int]
    rows: int
    names: frozenset[str] | None
    ranges: dict[str, tuple[str, str] | None]
    keyed: bool
    path: str | None = None

    def table(self) -> pa.Table | None:
        """The merged aggregates (read memory-mapped at the first call); None when the file no longer reads."""
        if self.partials is None and self.path is not None:
            self.partials = _read_table(self.path)
            self.path = None
        return self.partials


def stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


_cache: collections.OrderedDict[str, tuple[Stamp, Rollup | None]] = collections.OrderedDict()


def load_rollup(run_dir: str) -> Rollup | None:
    """The rollup of the local ``run_dir`` as written (None: none, unreadable, or another version). Whether it still
    covers the directory is the caller's question (:func:`covering`)."""
    path = os.path.join(run_dir, ROLLUP_NAME)
    st = side_files.checked(path, side_files.MAX_ARROW_BYTES)  # no FIFO, link or device is opened below
    if st is None:
        return None
    return cached(_cache, path, stamp_of(st), lambda: _read(path), CACHE_ENTRIES)


def _read_table(path: str) -> pa.Table | None:
    try:
        with pa.memory_map(path) as source:
            table = pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(use_threads=False)).read_all()
    except (OSError, ValueError, pa.ArrowException):
        return None
    return checked_table(table, S.ROLLUP_SCHEMA)


def _read(path: str) -> Rollup | None:
    """The rollup's description (its schema message alone); the table is read when asked for."""
    try:
        with pa.memory_map(path) as source:
            schema = pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(use_threads=False)).schema
        meta = orjson.loads((schema.metadata or {})[META_ROLLUP.encode()])
        if schema.remove_metadata() != S.ROLLUP_SCHEMA or meta.get("version") != ROLLUP_VERSION:
            return None
        files = {str(n): (int(a), int(b), int(c)) for n, (a, b, c) in meta["files"].items()}
        ranges = {str(n): (None if r is None else (str(r[0]), str(r[1]))) for n, r in meta["ranges"].items()}
        names = None if meta["names"] is None else frozenset(str(n) for n in meta["names"])
        steps, rows, keyed = [int(s) for s in meta["steps"]], int(meta["rows"]), bool(meta["loose"])
        return Rollup(files, None, steps, rows, names, ranges, keyed, path) if set(ranges) == set(files) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, pa.ArrowException):
        return None


def covering(run_dir: str, files: Sequence[str]) -> Rollup | None:
    """The rollup of ``run_dir`` when it covers exactly ``files`` (paths in it, as listed) as they are now."""
    got = load_rollup(run_dir)
    if got is None or len(got.files) != len(files):
        return None
    try:
        return None if any(got.files.get(os.path.basename(f)) != stamp_of(os.stat(f)) for f in files) else got
    except OSError:
        return None


def _write(run_dir: str, r: Rollup) -> None:
    meta = {
        "version": ROLLUP_VERSION,
        "files": {n: list(s) for n, s in sorted(r.files.items())},
        "steps": r.steps,
        "rows": r.rows,
        "names": None if r.names is None else sorted(r.names),
        "ranges": {n: (None if v is None else list(v)) for n, v in sorted(r.ranges.items())},
        "loose": r.keyed,
    }
    path = os.path.join(run_dir, ROLLUP_NAME)
    schema = S.ROLLUP_SCHEMA.with_metadata({META_ROLLUP: orjson.dumps(meta).decode()})
    table = with_value_metrics(_whole(r).select(S.STEP_PARTIALS_SCHEMA.names).cast(S.STEP_PARTIALS_SCHEMA))

    def write(f: BinaryIO) -> None:
        with pa.ipc.new_file(f, schema) as w:
            w.write_table(table.combine_chunks())

    write_replacing(path, f"{path}.{os.getpid()}.{threading.get_ident()}.tmp", write)
    fsync_dir(run_dir)


@dataclasses.dataclass
class _File:
    path: str
    stamp: Stamp
    index: ShardIndex
    range: tuple[str, str] | None
    keyed: bool


def _closed_files(run_dir: str) -> list[_File]:
    """The directory's listed files that are closed and indexed (open, unindexed and vanished ones left out)."""
    names, _ = listing(run_dir)
    out = []
    for n in names:
        path = os.path.join(run_dir, n)
        try:
            before = stamp_of(os.stat(path))
        except OSError:
            continue
        index = load_shard_index(path)
        if index is None:
            continue
        stored = stored_step_partials(index)  # None: nothing known, never merged in alone
        keyed = stored is None or stored.keyed_steps is not None
        out.append(_File(path, before, index, None if stored is None else stored.trace_range, keyed))
    return out


def _overlap(a: tuple[str, str] | None, b: tuple[str, str] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def update(run_dir: str, of_files: PartialsOfFiles, wait_s: float = LOCK_WAIT_S) -> bool:
    """Bring the rollup of the local ``run_dir`` up to date with its closed, indexed files (aggregated by
    ``of_files``); False when another update kept the lock past ``wait_s`` or nothing is closed. Raises what
    the filesystem raises."""
    # Read-only: an flock needs no write access, and no file is kept open for writing while it waits.
    fd = exclusive_within(os.open(os.path.join(run_dir, LOCK_NAME), os.O_RDONLY | os.O_CREAT, 0o644), wait_s)
    if fd is None:
        return False
    try:
        # Temp files of updates that died before their rename (only the lock's holder writes one).
        for e in os.scandir(run_dir):
            if e.name.startswith(ROLLUP_NAME + ".") and e.name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.remove(e.path)
        # Files other writers closed while this update ran are taken too (they may have given up waiting).
        for _ in range(MAX_ROUNDS):
            wrote = _step(run_dir, of_files)
            if wrote is None:
                return False
            if not wrote:
                break
        return True
    finally:
        os.close(fd)


#: Rounds an update runs while files keep closing during it.
MAX_ROUNDS = 4


def _step(run_dir: str, of_files: PartialsOfFiles) -> bool | None:
    """One round of :func:`update`: whether it wrote the rollup; None when no file is closed."""
    files = _closed_files(run_dir)
    if not files:
        return None
    current = load_rollup(run_dir)
    by_name = {os.path.basename(f.path): f for f in files}
    if current is not None and all(n in by_name and by_name[n].stamp == s for n, s in current.files.items()):
        new = [f for n, f in by_name.items() if n not in current.files]
        if not new:
            return False
        joins = current.keyed or any(f.keyed or any(_overlap(f.range, r) for r in current.ranges.values()) for f in new)
        if not joins:  # nothing of the new files belongs to a covered trajectory: merge what they add
            added = of_files([f.path for f in new])
            _write(run_dir, Rollup(partials=merge_step_partials([_whole(current), added]), **_described(files)))
            return True
    _write(run_dir, _built(files, of_files))
    return True


def _described(files: Sequence[_File]) -> dict[str, Any]:
    names: set[str] | None = set()
    steps: set[int] = set()
    for f in files:
        steps |= f.index.steps()
        if names is not None:
            names = None if f.index.names is None else names | f.index.names
    return {
        "files": {os.path.basename(f.path): f.stamp for f in files},
        "steps": sorted(steps),
        "rows": sum(sum(f.index.batch_rows) for f in files),
        "names": None if names is None else frozenset(names),
        "ranges": {os.path.basename(f.path): f.range for f in files},
        "keyed": any(f.keyed for f in files),
    }


def _built(files: Sequence[_File], of_files: PartialsOfFiles) -> Rollup:
    return Rollup(partials=of_files([f.path for f in files]), **_described(files))


def _whole(r: Rollup) -> pa.Table:
    got = r.table()
    if got is None:
        raise ValueError("the rollup's table does not read")
    return got


def update_quietly(run_dir: str, of_files: PartialsOfFiles) -> None:
    """:func:`update`, for writers, seals and compaction: any failure leaves the rollup as it was (readers
    then read the files' indexes), never reaching the caller."""
    with contextlib.suppress(Exception):
        update(run_dir, of_files)


_pending: dict[str, PartialsOfFiles] = {}
_pending_lock = threading.Lock()
_worker: list[threading.Thread] = []


def update_later(run_dir: str, of_files: PartialsOfFiles) -> None:
    """:func:`update_quietly` on a thread of its own (one per process, taking requests in turn), for a
    writer rotating files: its thread goes on writing spans while the rollup waits for its lock."""
    with _pending_lock:
        _pending[run_dir] = of_files
        if _worker and _worker[0].is_alive():
            return
        t = threading.Thread(target=_drain, name="rollout-trace-rollup", daemon=True)
        _worker[:] = [t]
        t.start()


def wait_idle(timeout_s: float = LOCK_WAIT_S) -> None:
    """Wait (at most ``timeout_s``) for the rollup thread's pending updates: a writer's last close does."""
    with _pending_lock:
        t = _worker[0] if _worker else None
    if t is not None and t is not threading.current_thread():
        t.join(timeout_s)


def _drain() -> None:
    while True:
        with _pending_lock:
            if not _pending:
                _worker.clear()
                return
            run_dir, of_files = _pending.popitem()
        update_quietly(run_dir, of_files)


def _after_fork() -> None:  # the child has no worker, and the lock may have been held by another thread
    global _pending_lock
    _pending_lock = threading.Lock()
    _pending.clear()
    _worker.clear()


os.register_at_fork(after_in_child=_after_fork)
atexit.register(wait_idle)  # a process that ends (a CLI read that sealed shards) lets its update finish, 2 s at most
