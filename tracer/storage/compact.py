"""``rollout-trace compact``: merge small shard files into large, step-indexed ones.

Workers write many small stream files (one per process, rotated by size).
Compaction reads the *closed* ones of each run directory (those ending with
the end-of-stream marker; files still being written are left alone), sorts
the rows by step, sample, rollout and trace so that a trajectory's spans and
a step's trajectories sit together, and writes Arrow IPC *files* (with a
footer) whose record batches each hold one step. ``_index.json`` records
which batch holds which step, so reading one step opens only its batches.

Every row is kept exactly once, and the originals stay until the merge is
durable. The order of operations makes a crash at any point safe:

1. write the merged files as ``*.tmp`` and fsync them;
2. write the index with the new entries and the names they replace (atomic rename);
3. rename the ``*.tmp`` files to ``*.arrow`` (readers now skip the replaced files);
4. delete the originals, then drop the ``replaces`` lists from the index.

A crash before 3 leaves entries whose file does not exist: ignored, the
originals are read. A crash after 3 leaves originals that readers skip.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import secrets
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S
from tracer.read import _read_file, read_schema
from tracer.storage.check import _ends_with_eos
from tracer.storage.index import INDEX_NAME, is_arrow_file_format, load_index, replaced_files, save_index
from tracer.storage.writer import fsync_dir

#: Aim for compacted files of about this size.
DEFAULT_TARGET_BYTES = 256 * 1024 * 1024
#: Rows per record batch at most (a step with more rows spans several batches).
MAX_BATCH_ROWS = 65536
LOCK_NAME = "_compact.lock"
META_COMPACTED_FROM = "rollout_trace.compacted_from"
_SORT_KEYS = [
    (S.STEP, "ascending"),
    (S.VALIDATE, "ascending"),
    (S.SAMPLE_INDEX, "ascending"),
    (S.ROLLOUT_N, "ascending"),
    (S.TRACE_ID, "ascending"),
    (S.START_NS, "ascending"),
]


@dataclasses.dataclass
class CompactReport:
    """What a compaction did."""

    run_dirs: int = 0
    files_in: int = 0
    files_out: int = 0
    rows: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    skipped_open: list[str] = dataclasses.field(default_factory=list)


def _run_dirs(path: str) -> list[str]:
    if os.path.isfile(path):
        raise ValueError(f"compact takes a directory, not a file: {path!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"trace path {path!r} does not exist; give the directory of a run")
    out = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        if any(f.endswith(S.FILE_SUFFIX) for f in files):
            out.append(root)
    return out


def compact(path: str | os.PathLike[str], target_bytes: int = DEFAULT_TARGET_BYTES) -> CompactReport:
    """Compact every run directory under ``path``; see the module docstring."""
    report = CompactReport()
    for run_dir in _run_dirs(os.fspath(path)):
        with open(os.path.join(run_dir, LOCK_NAME), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one compaction of a directory at a time
            try:
                _compact_dir(run_dir, target_bytes, report)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return report


def _compact_dir(run_dir: str, target_bytes: int, report: CompactReport) -> None:
    index = load_index(run_dir)
    _finish_interrupted(run_dir, index)
    for name in os.listdir(run_dir):
        if name.endswith(S.FILE_SUFFIX + ".tmp"):
            os.remove(os.path.join(run_dir, name))  # an interrupted compaction's output
    hidden = replaced_files(run_dir, index)
    inputs = []
    for name in sorted(os.listdir(run_dir)):
        full = os.path.join(run_dir, name)
        if not name.endswith(S.FILE_SUFFIX) or name in hidden or name in index["files"] or is_arrow_file_format(full):
            continue
        if not _ends_with_eos(full):
            report.skipped_open.append(full)
            continue
        inputs.append(full)
    report.run_dirs += 1
    # Memory stays bounded: each group of inputs up to target_bytes is merged on its own.
    group: list[str] = []
    size = 0
    for full in inputs:
        group.append(full)
        size += os.path.getsize(full)
        if size >= target_bytes:
            _merge(run_dir, group, index, report)
            group, size = [], 0
    if group:
        _merge(run_dir, group, index, report)


def _merge(run_dir: str, inputs: list[str], index: dict[str, Any], report: CompactReport) -> None:
    """Merge ``inputs`` into one compacted file, following steps 1-4 of the module docstring."""
    batches = [b for f in inputs for b in _read_file(f, list(S.SPAN_COLUMNS))]
    table = pa.Table.from_batches(batches, schema=S.SPAN_SCHEMA) if batches else S.SPAN_SCHEMA.empty_table()
    del batches
    bytes_in = sum(os.path.getsize(f) for f in inputs)
    meta = dict(read_schema(inputs[0]).metadata or {})
    meta[META_COMPACTED_FROM.encode()] = str(len(inputs)).encode()
    table = table.sort_by(_SORT_KEYS)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    name = f"compacted_{stamp}_{secrets.token_hex(4)}{S.FILE_SUFFIX}"
    entry = _write_compacted(os.path.join(run_dir, name + ".tmp"), table, S.SPAN_SCHEMA.with_metadata(meta))
    fsync_dir(run_dir)
    index["files"][name] = {**entry, "replaces": [os.path.basename(f) for f in inputs], "group": [name]}
    save_index(run_dir, index)
    os.replace(os.path.join(run_dir, name + ".tmp"), os.path.join(run_dir, name))
    fsync_dir(run_dir)
    _finish_interrupted(run_dir, index)
    report.files_in += len(inputs)
    report.files_out += 1
    report.rows += table.num_rows
    report.bytes_in += bytes_in
    report.bytes_out += entry["size"]


def _finish_interrupted(run_dir: str, index: dict[str, Any]) -> None:
    """Bring the directory to a consistent state after a compaction stopped at any step.

    For each group of outputs in the index: if every output exists (or its
    fsync'd ``.tmp`` does, and is renamed now), delete the originals it
    replaces; otherwise the compaction never reached step 3, so its
    entries and partial outputs go and the originals stay the truth.
    """
    changed = False
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, entry in index["files"].items():
        groups.setdefault(tuple(entry.get("group", [name])), []).append(name)
    for group in groups:
        paths = [os.path.join(run_dir, g) for g in group]
        if not all(os.path.exists(p) or os.path.exists(p + ".tmp") for p in paths):
            for p in paths:
                for q in (p, p + ".tmp"):
                    if os.path.exists(q):
                        os.remove(q)
            for g in group:
                index["files"].pop(g, None)
            changed = True
            continue
        for p in paths:
            if not os.path.exists(p):
                os.replace(p + ".tmp", p)
        fsync_dir(run_dir)
        for g in group:
            entry = index["files"].get(g, {})
            for old in entry.get("replaces", []):
                try:
                    os.remove(os.path.join(run_dir, old))
                except FileNotFoundError:
                    pass
            if entry.get("replaces"):
                entry["replaces"] = []
                changed = True
    if changed:
        fsync_dir(run_dir)
        save_index(run_dir, index)


def _write_compacted(path: str, table: pa.Table, schema: pa.Schema) -> dict[str, Any]:
    """Write ``table`` (sorted by step) as an IPC file, one step per batch; return its index entry."""
    batch_steps: list[int | None] = []
    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", 3))
    with open(path, "wb") as sink:
        with pa.ipc.new_file(sink, schema, options=options) as writer:
            steps = table.column(S.STEP)
            start = 0
            n = table.num_rows
            while start < n:
                step = steps[start].as_py()
                same = pc.equal(steps.slice(start), step) if step is not None else pc.is_null(steps.slice(start))
                run = pc.index(pc.fill_null(same, False), False).as_py()
                length = (n - start) if run < 0 else run
                for off in range(0, length, MAX_BATCH_ROWS):
                    chunk = table.slice(start + off, min(MAX_BATCH_ROWS, length - off))
                    writer.write_batch(chunk.combine_chunks().to_batches()[0])
                    batch_steps.append(step)
                start += length
        sink.flush()
        os.fsync(sink.fileno())
    return {"size": os.path.getsize(path), "rows": table.num_rows, "batch_steps": batch_steps, "format": "ipc-file"}


__all__ = ["CompactReport", "DEFAULT_TARGET_BYTES", "INDEX_NAME", "compact"]
