"""``rollout-trace compact``: merge small shard files into large, step-indexed ones.

Workers write many small shard files (one per process, rotated by size).
Compaction reads the *closed* ones of each run directory (those with their
footer or end-of-stream marker; files still being written are left alone),
after sealing the shards whose writer is gone however it ended
(:mod:`tracer.storage.seal`: a Ray worker at shutdown, ``os._exit``,
SIGKILL), sorts
the rows by step, sample, rollout and trace so that a trajectory's spans and
a step's trajectories sit together, and writes Arrow IPC *files* (with a
footer) whose record batches each hold one step. ``_index.json`` records
which batch holds which step, so reading one step opens only its batches.

Compaction merges only what it read completely: a regular file, closed
(end-of-stream marker), in this tool's format or an older one, every batch
read without damage or refusal (:attr:`tracer.storage.files.FileRead.complete`).
Everything else stays where it is, untouched, and is named in the report
(:attr:`CompactReport.set_aside`): files still open, torn or corrupt ones
(``rollout-trace check --repair`` handles those), foreign Arrow files, newer
formats, FIFOs and links. The merged file gets this tool's schema version
and only the metadata its inputs agree on, so it reads like its inputs did.

Every row is kept exactly once, and the originals stay until the merge is
durable. The order of operations makes a crash at any point safe:

1. write the merged files as ``*.tmp`` and fsync them;
2. write the index with the new entries and the names they replace (atomic rename);
3. rename the ``*.tmp`` files to ``*.arrow`` (readers now skip the replaced files);
4. under the directory's exclusive lock (:mod:`tracer.storage.locks`), delete
   the originals, then drop the ``replaces`` lists from the index.

A crash before 3 leaves entries whose file does not exist: ignored, the
originals are read. A crash after 3 leaves originals that readers skip.
Readers hold the shared lock from listing a directory to reading its last
file, so step 4 never removes a file a reader has listed; if readers hold it
for longer than :data:`DELETE_WAIT_S`, the originals stay (hidden by the
index) and the next compaction deletes them.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import secrets
import shutil
import stat
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from tracer import schema as S
from tracer.read import iter_batches
from tracer.storage.files import FileRead, read_batches
from tracer.storage.index import INDEX_NAME, load_index, replaced_files, save_index
from tracer.storage.locks import try_exclusive
from tracer.storage.seal import LIVE, SEALED, seal_if_abandoned
from tracer.storage.writer import fsync_dir

#: Aim for compacted files of about this size.
DEFAULT_TARGET_BYTES = 256 * 1024 * 1024
#: Rows per record batch at most (a step with more rows spans several batches).
MAX_BATCH_ROWS = 65536
LOCK_NAME = "_compact.lock"
#: How long step 4 waits for readers to let go of a directory before leaving its originals for next time.
DELETE_WAIT_S = 5.0
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
    #: Shards closed here because their writer was gone (then merged like any other).
    sealed: list[str] = dataclasses.field(default_factory=list)
    #: Files left where they are because they could not be read completely, with the reason.
    set_aside: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    #: Replaced originals not deleted yet (readers held the directory); the next compaction deletes them.
    deferred: int = 0


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


def compact(
    path: str | os.PathLike[str], target_bytes: int = DEFAULT_TARGET_BYTES, seal_after_s: float | None = None
) -> CompactReport:
    """Compact every run directory under ``path``; see the module docstring.

    Args:
        path: A run directory or a tree of them.
        target_bytes: Aim for compacted files of about this size.
        seal_after_s: Seal shards of other hosts unchanged this long (default
            :func:`tracer.storage.seal.seal_after_s`).
    """
    report = CompactReport()
    for run_dir in _run_dirs(os.fspath(path)):
        with open(os.path.join(run_dir, LOCK_NAME), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one compaction of a directory at a time
            try:
                _compact_dir(run_dir, target_bytes, report, seal_after_s)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return report


def _compact_dir(run_dir: str, target_bytes: int, report: CompactReport, seal_after_s: float | None) -> None:
    index = load_index(run_dir)
    _finish_interrupted(run_dir, index, report)
    for name in os.listdir(run_dir):
        if name.endswith(S.FILE_SUFFIX + ".tmp"):
            os.remove(os.path.join(run_dir, name))  # an interrupted compaction's output
    hidden = replaced_files(run_dir, index)
    candidates = []
    for name in sorted(os.listdir(run_dir)):
        full = os.path.join(run_dir, name)
        if not name.endswith(S.FILE_SUFFIX) or name in hidden or name in index["files"]:
            continue
        try:
            mode = os.lstat(full).st_mode
        except OSError:
            continue
        if stat.S_ISLNK(mode):
            report.set_aside.append((full, "a symbolic link (its target may be elsewhere): not merged"))
        elif not stat.S_ISREG(mode):
            report.set_aside.append((full, "not a regular file (a FIFO, device or directory): not opened"))
        else:
            sealing = seal_if_abandoned(full, seal_after_s)
            if sealing.action == SEALED:
                report.sealed.append(full)
            elif sealing.action == LIVE:
                report.skipped_open.append(full)
                continue
            candidates.append(full)
    report.run_dirs += 1
    # Memory stays bounded: each group of inputs up to target_bytes is merged on its own.
    group: list[str] = []
    size = 0
    for full in candidates:
        group.append(full)
        size += os.path.getsize(full)
        if size >= target_bytes:
            _merge(run_dir, group, index, report)
            group, size = [], 0
    if group:
        _merge(run_dir, group, index, report)
    _finish_interrupted(run_dir, index, report)  # step 4, once for every merge of this directory


def _merged_metadata(reads: list[tuple[pa.Schema, FileRead]]) -> dict[bytes, bytes]:
    """This tool's schema version, and the metadata every input agrees on."""
    common: dict[bytes, bytes] | None = None
    for schema, _ in reads:
        meta = dict(schema.metadata or {})
        common = meta if common is None else {k: v for k, v in common.items() if meta.get(k) == v}
    out = dict(common or {})
    out[S.META_SCHEMA_VERSION.encode()] = S.SCHEMA_VERSION.encode()
    return out


def _merge(run_dir: str, candidates: list[str], index: dict[str, Any], report: CompactReport) -> None:
    """Merge what of ``candidates`` reads completely into one compacted file (steps 1-4 of the module docstring)."""
    batches: list[pa.RecordBatch] = []
    inputs: list[str] = []
    reads: list[tuple[pa.Schema, FileRead]] = []
    for file in candidates:
        reading = read_batches(file, list(S.SPAN_COLUMNS))
        got = list(reading)
        result = reading.result
        if result.complete and reading.schema is not None:
            batches.extend(got)
            inputs.append(file)
            reads.append((reading.schema, result))
        elif result.sound and not result.closed:
            report.skipped_open.append(file)
        else:
            report.set_aside.append((file, result.describe() or "not read completely"))
    if not inputs:
        return
    table = pa.Table.from_batches(batches, schema=S.SPAN_SCHEMA) if batches else S.SPAN_SCHEMA.empty_table()
    del batches
    rows_in = sum(r.rows for _, r in reads)
    bytes_in = sum(r.size for _, r in reads)
    meta = _merged_metadata(reads)
    meta[META_COMPACTED_FROM.encode()] = str(len(inputs)).encode()
    table = table.sort_by(_SORT_KEYS)
    assert table.num_rows == rows_in
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    name = f"compacted_{stamp}_{secrets.token_hex(4)}{S.FILE_SUFFIX}"
    entry = _write_compacted(os.path.join(run_dir, name + ".tmp"), table, S.SPAN_SCHEMA.with_metadata(meta))
    fsync_dir(run_dir)
    index["files"][name] = {**entry, "replaces": [os.path.basename(f) for f in inputs], "group": [name]}
    save_index(run_dir, index)
    os.replace(os.path.join(run_dir, name + ".tmp"), os.path.join(run_dir, name))
    fsync_dir(run_dir)
    report.files_in += len(inputs)
    report.files_out += 1
    report.rows += table.num_rows
    report.bytes_in += bytes_in
    report.bytes_out += entry["size"]


def _finish_interrupted(run_dir: str, index: dict[str, Any], report: CompactReport) -> None:
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
        doomed = [(g, old) for g in group for old in index["files"].get(g, {}).get("replaces", [])]
        if not doomed:
            continue
        lock = try_exclusive(run_dir, DELETE_WAIT_S)
        if lock is None:  # readers still hold the directory: the index hides these; delete next time
            report.deferred += len(doomed)
            continue
        try:
            for _, old in doomed:
                try:
                    os.remove(os.path.join(run_dir, old))
                except FileNotFoundError:
                    pass
            for g in group:
                entry = index["files"].get(g, {})
                if entry.get("replaces"):
                    entry["replaces"] = []
                    changed = True
            if changed:
                fsync_dir(run_dir)
                save_index(run_dir, index)
                changed = False
        finally:
            os.close(lock)
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


__all__ = ["CompactReport", "DEFAULT_TARGET_BYTES", "INDEX_NAME", "PARQUET_DIR", "compact", "write_parquet"]


#: Where ``compact --format parquet`` writes, under the path compacted, unless told otherwise.
PARQUET_DIR = "parquet"


def write_parquet(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> tuple[str, int]:
    """Write the spans under ``path`` as a step-partitioned, zstd Parquet dataset; return (directory, rows).

    The layout is Hive-style (``step=3/part-0.parquet``; spans without a step
    under ``step=__HIVE_DEFAULT_PARTITION__``), which DuckDB's
    ``read_parquet(..., hive_partitioning=true)``, Spark, Ray Data and
    Hugging Face ``datasets`` load as they are. The rows are those
    :func:`tracer.read_spans` returns (read in batches, never all at once);
    the trace files stay. The dataset is written beside its final place and
    renamed into it, so a reader never sees half of one.

    Args:
        path: A run directory or a tree of them.
        out: The dataset's directory (default ``path/parquet``); replaced if it exists.
    """
    src = os.fspath(path)
    if not os.path.isdir(src):
        raise FileNotFoundError(f"trace path {src!r} is not a directory; give the directory of a run")
    target = os.fspath(out) if out is not None else os.path.join(src, PARQUET_DIR)
    tmp = f"{target}.tmp-{secrets.token_hex(4)}"
    counted = [0]

    def batches() -> Any:
        for _, batch in iter_batches(src):
            counted[0] += batch.num_rows
            yield batch

    reader = pa.RecordBatchReader.from_batches(S.SPAN_SCHEMA, batches())
    options = pds.ParquetFileFormat().make_write_options(compression="zstd")
    pds.write_dataset(
        reader,
        tmp,
        format="parquet",
        partitioning=pds.partitioning(pa.schema([S.SPAN_SCHEMA.field(S.STEP)]), flavor="hive"),
        file_options=options,
        basename_template="part-{i}.parquet",
        max_rows_per_group=MAX_BATCH_ROWS,
    )
    old = None
    if os.path.exists(target):
        old = f"{target}.old-{secrets.token_hex(4)}"
        os.replace(target, old)
    os.replace(tmp, target)
    fsync_dir(os.path.dirname(os.path.abspath(target)))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target, counted[0]
