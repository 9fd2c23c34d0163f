"""``rollout-trace compact``: merge the closed shard files of a run directory into step-indexed Arrow files.

Shards whose writer is gone are sealed first (:mod:`tracer.storage.seal`). Rows are sorted by step, sample,
rollout and trace; each record batch holds one step and ``_index.json`` says which. Only files read completely
are merged (the rest are named in :attr:`CompactReport.set_aside`), keeping the metadata they agree on.
Every row is kept exactly once; a crash at any point is safe by the order of operations:

1. write the merged files as ``*.tmp`` and fsync them (possibly elsewhere: :mod:`tracer.storage.compact_ray`);
2. write the index with the new entries and the names they replace (atomic rename);
3. rename the ``*.tmp`` files to ``*.arrow`` (readers now skip the replaced files);
4. under the directory's exclusive lock (readers hold it shared while they list and read; waited for up to
   :data:`DELETE_WAIT_S`, else left to the next compaction), delete the originals, then the ``replaces`` lists.

Each merged file gets its shard index (:mod:`tracer.index.shard`; never fails the compaction). On object stores
step 3 is a server-side copy, the index one PUT, and step 4 deletes originals hidden for ``delete_after_s``
(:data:`REMOTE_DELETE_AFTER_S`); run one compaction of a prefix at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from tracer import schema as S
from tracer.index import closed
from tracer.index import shard as _shard
from tracer.index.shard import ShardIndexBuilder, shard_index_path, warn_no_index, write_shard_index
from tracer.read import iter_batches
from tracer.storage import uri as _uri
from tracer.storage.decisions import file_decisions, metadata_value
from tracer.storage.files import read_batches
from tracer.storage.index import INDEX_NAME, load_index, replaced_files, save_index
from tracer.storage.locks import try_exclusive
from tracer.storage.seal import LIVE, SEALED, seal_if_abandoned
from tracer.storage.upload import upload_file
from tracer.storage.writer import fsync_dir

#: Aim for compacted files of about this size.
DEFAULT_TARGET_BYTES = 256 * 1024 * 1024
#: Rows per record batch at most (a step with more rows spans several batches).
MAX_BATCH_ROWS = 65536
LOCK_NAME = "_compact.lock"
#: How long step 4 waits for readers to let go of a directory before leaving its originals for next time.
DELETE_WAIT_S = 5.0
META_COMPACTED_FROM = "rollout_trace.compacted_from"
#: Index entry key: when (Unix seconds) the entry began to hide the originals it replaces.
REPLACED_AT = "replaced_at"
#: On object stores (no locks), how long replaced originals stay after a merge hides them (for readers that listed).
REMOTE_DELETE_AFTER_S = 600.0
_SORT_KEYS = [(key, "ascending") for key in (S.STEP, S.VALIDATE, S.SAMPLE_INDEX, S.ROLLOUT_N, S.TRACE_ID, S.START_NS)]


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
    #: Merges that failed (a dead Ray task, an unreachable store), with the reason; their inputs stay as they were.
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class MergeUnit:
    """One merge: input files of one run directory and the compacted file they become (plain strings: a Ray task)."""

    run_dir: str
    files: tuple[str, ...]
    name: str


@dataclasses.dataclass
class MergeResult:
    """What :func:`merge_unit` read and wrote; the index is not touched yet."""

    unit: MergeUnit
    #: The files merged (read completely).
    inputs: list[str] = dataclasses.field(default_factory=list)
    #: The index entry of the written ``<name>.tmp`` (None when nothing was merged).
    entry: dict[str, Any] | None = None
    rows: int = 0
    bytes_in: int = 0
    skipped_open: list[str] = dataclasses.field(default_factory=list)
    set_aside: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    #: The shard index of a local merge, written once the file has its name.
    index: ShardIndexBuilder | None = None


def _index_name(name: str) -> str:
    return os.path.basename(shard_index_path(name))


class _Dir:
    """A run directory: a local (or shared, POSIX) path, or a URI of an object store, through pyarrow."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.remote = _uri.is_remote(path)
        self.fs, self.root = _uri.filesystem(path) if self.remote else (pafs.LocalFileSystem(), path)

    def full(self, name: str) -> str:
        return _uri.join_uri(self.path, name) if self.remote else os.path.join(self.path, name)

    def _key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def names(self) -> list[str]:
        if not self.remote:
            return sorted(os.listdir(self.path))
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, recursive=False, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)

    def exists(self, name: str) -> bool:
        return bool(self.fs.get_file_info(self._key(name)).type == pafs.FileType.File)

    def remove(self, name: str) -> None:
        if self.exists(name):
            self.fs.delete_file(self._key(name))

    def replace(self, src: str, dst: str) -> None:
        self.fs.move(self._key(src), self._key(dst))

    def sync(self) -> None:
        if not self.remote:  # a completed PUT or copy is durable
            fsync_dir(self.path)

    def save_index(self, index: dict[str, Any]) -> None:
        if not self.remote:
            return save_index(self.path, index)
        with tempfile.TemporaryDirectory(prefix="rollout-trace-compact-") as stage:
            save_index(stage, index)
            upload_file(os.path.join(stage, INDEX_NAME), self.path)  # readers see the old index or the new one

    def may_delete(self, entries: list[dict[str, Any]], delete_after_s: float) -> Callable[[], None] | None:
        """How to let go once the originals may go (the exclusive lock, or ``delete_after_s`` on a store); else None."""
        if not self.remote:
            fd = try_exclusive(self.path, DELETE_WAIT_S)
            return None if fd is None else (lambda: os.close(fd))
        now = time.time()
        return (lambda: None) if all(now - float(e.get(REPLACED_AT, 0.0)) >= delete_after_s for e in entries) else None


def run_dirs(path: str | os.PathLike[str]) -> list[str]:
    """The run directories (holding trace files) under ``path``, sorted; FileNotFoundError, or ValueError for a file."""
    src = os.fspath(path)
    if _uri.is_remote(src):
        base = _uri.strip_query(src).rstrip("/")
        parents = set()
        for found in _uri.list_remote(src):
            rel = _uri.strip_query(found)[len(base) :].lstrip("/")
            parents.add(_uri.join_uri(src, os.path.dirname(rel)))
        return sorted(parents)
    if os.path.isfile(src):
        raise ValueError(f"compact takes a directory, not a file: {src!r}")
    if not os.path.isdir(src):
        raise FileNotFoundError(f"trace path {src!r} does not exist; give the directory of a run")
    out = []
    for root, dirs, files in os.walk(src):
        dirs.sort()
        if any(f.endswith(S.FILE_SUFFIX) for f in files):
            out.append(root)
    return out


@contextlib.contextmanager
def compacting(run_dir: str) -> Iterator[None]:
    """Hold the compaction lock of a local run directory (object stores have none)."""
    if _uri.is_remote(run_dir):
        yield
        return
    with open(os.path.join(run_dir, LOCK_NAME), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def compact(
    path: str | os.PathLike[str],
    target_bytes: int = DEFAULT_TARGET_BYTES,
    seal_after_s: float | None = None,
    delete_after_s: float | None = None,
) -> CompactReport:
    """Compact every run directory under ``path`` (local or a URI); see the module docstring. ``seal_after_s``: seal
    shards of other hosts unchanged this long (default :func:`tracer.storage.seal.seal_after_s`); ``delete_after_s``
    defaults to :data:`REMOTE_DELETE_AFTER_S`."""
    return compact_dirs(run_dirs(path), target_bytes, seal_after_s, delete_after_s)


def compact_dirs(
    dirs: list[str],
    target_bytes: int,
    seal_after_s: float | None,
    delete_after_s: float | None,
    merges: Callable[[list[MergeUnit]], Iterable[tuple[MergeUnit, MergeResult | str]]] | None = None,
) -> CompactReport:
    """Compact ``dirs`` (from :func:`run_dirs`). ``merges`` runs the merges (:func:`merge_unit`; None: one after the
    other, here), yielding each unit with its result or why it failed; steps 2-4 happen here alone."""
    after_s = REMOTE_DELETE_AFTER_S if delete_after_s is None else delete_after_s
    report = CompactReport()
    with contextlib.ExitStack() as held:
        plans: dict[str, tuple[_Dir, dict[str, Any], set[str]]] = {}
        units: list[MergeUnit] = []
        for run_dir in dirs:
            held.enter_context(compacting(run_dir))
            d = _Dir(run_dir)
            index, planned = _plan_dir(d, target_bytes, report, seal_after_s, after_s)
            plans[run_dir] = (d, index, {u.name for u in planned})
            units.extend(planned)
            if not planned:
                _finish_dir(d, index, report, after_s)
        for unit, result in ((u, merge_unit(u)) for u in units) if merges is None else merges(units):
            d, index, left = plans[unit.run_dir]
            if isinstance(result, str):
                report.failed.append((unit.run_dir, f"merge of {len(unit.files)} file(s): {result}"))
                for name in (unit.name + ".tmp", _index_name(unit.name)):  # readers never list them
                    with contextlib.suppress(OSError):
                        d.remove(name)
            else:
                _commit_merge(d, result, index, report)
            left.discard(unit.name)
            if not left:
                _finish_dir(d, index, report, after_s)
    return report


#: Words of a store's error ("|" between them) -> what to fix; the first match wins.
_STORE_HINTS = {
    "NETWORK_CONNECTION|curlCode|Could not connect|Couldn't connect|resolve host": (
        "the storage endpoint for bucket {bucket!r} did not answer: set AWS_ENDPOINT_URL (or "
        "?endpoint_override=host:port in the URI) to your S3-compatible server, or unset it for AWS"
    ),
    "ACCESS_DENIED|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|HTTP status 403|credentials|ExpiredToken": (
        "bucket {bucket!r} refused the credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
        "(or AWS_PROFILE), and AWS_DEFAULT_REGION to the bucket's region"
    ),
    "NO_SUCH_BUCKET|NoSuchBucket": (
        "bucket {bucket!r} does not exist at this endpoint (check the name, AWS_ENDPOINT_URL and the region)"
    ),
    "": "{scheme}:// bucket {bucket!r}: check AWS_ENDPOINT_URL, the credentials (AWS_*) and the region",
}


def describe_store_error(uri: str, exc: BaseException) -> str:
    """One line for pyarrow's error ``exc`` compacting ``uri``: the bucket, what went wrong and which setting to fix."""
    scheme, _, rest = _uri.strip_query(uri).partition("://")
    text = " ".join(str(exc).split())
    hint = next(h for words, h in _STORE_HINTS.items() if any(w in text for w in words.split("|")))
    return f"{hint.format(scheme=scheme, bucket=rest.split('/', 1)[0])} ({type(exc).__name__}: {text[:300]})"


def _plan_dir(
    d: _Dir, target_bytes: int, report: CompactReport, seal_after_s: float | None, delete_after_s: float
) -> tuple[dict[str, Any], list[MergeUnit]]:
    """Finish an interrupted compaction, seal abandoned shards; the index and the merges of ``target_bytes``."""
    index = load_index(d.path)
    _finish_interrupted(d, index, report, delete_after_s)
    names = d.names()
    for name in names:
        if name.endswith(S.FILE_SUFFIX + ".tmp"):  # an interrupted compaction's output, and its index if it got one
            d.remove(name)
            d.remove(_index_name(name[: -len(".tmp")]))
    hidden = replaced_files(index, set(names))  # under the lock, after the finish: the listing is current
    candidates: list[tuple[str, int]] = []
    for name in names:
        if not name.endswith(S.FILE_SUFFIX) or name in hidden or name in index["files"]:
            continue
        full = d.full(name)
        if d.remote:  # objects are whole files, uploaded once closed (sealed where they were written)
            candidates.append((full, int(d.fs.get_file_info(d._key(name)).size)))
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
            sealing = seal_if_abandoned(full, seal_after_s, on_sealed=None)
            if sealing.action == SEALED:
                report.sealed.append(full)
            elif sealing.action == LIVE:
                report.skipped_open.append(full)
                continue
            candidates.append((full, os.path.getsize(full)))
    report.run_dirs += 1
    groups: list[list[str]] = []
    size = target_bytes
    for full, nbytes in candidates:
        if size >= target_bytes:  # the group before is full
            groups.append([])
            size = 0
        groups[-1].append(full)
        size += nbytes
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return index, [
        MergeUnit(d.path, tuple(g), f"compacted_{stamp}_{secrets.token_hex(4)}{S.FILE_SUFFIX}") for g in groups
    ]


def merge_unit(unit: MergeUnit) -> MergeResult:
    """Merge what of ``unit.files`` reads completely into ``<unit.name>.tmp`` (step 1). Touches neither the index nor
    the inputs, so it may run anywhere (a Ray task); a death leaves at most a ``.tmp``, which readers never list."""
    out = MergeResult(unit)
    batches: list[pa.RecordBatch] = []
    common: dict[bytes, bytes] | None = None  # the schema metadata every input agrees on
    decisions: list[dict[str, Any]] = []
    for file in unit.files:
        reading = read_batches(file, list(S.SPAN_COLUMNS))
        pairs = list(reading.with_metadata())
        result = reading.result
        if result.complete and reading.schema is not None:
            batches.extend(b for b, _ in pairs)
            out.inputs.append(file)
            out.rows += result.rows
            out.bytes_in += result.size
            meta = dict(reading.schema.metadata or {})
            common = meta if common is None else {k: v for k, v in common.items() if meta.get(k) == v}
            decisions.extend(file_decisions(file, reading.schema.metadata, (c for _, c in pairs)))
        elif result.sound and not result.closed:
            out.skipped_open.append(file)
        else:
            out.set_aside.append((file, result.describe() or "not read completely"))
    if not out.inputs:
        return out
    table = pa.Table.from_batches(batches, schema=S.SPAN_SCHEMA)
    del batches
    meta = {**(common or {}), S.META_SCHEMA_VERSION.encode(): S.SCHEMA_VERSION.encode()}
    meta[META_COMPACTED_FROM.encode()] = str(len(out.inputs)).encode()
    if decisions:  # batch metadata does not survive the merge: the sampling decisions move to the file's
        meta[S.BATCH_META_SAMPLING.encode()] = metadata_value(decisions)
    table = table.sort_by(_SORT_KEYS)
    assert table.num_rows == out.rows
    d = _Dir(unit.run_dir)
    schema = S.SPAN_SCHEMA.with_metadata(meta)
    if not d.remote:
        out.entry, out.index = _write_compacted(d.full(unit.name + ".tmp"), table, schema)
    else:  # written locally first; uploaded as name.tmp, then its shard index (ignored until the rename)
        with tempfile.TemporaryDirectory(prefix="rollout-trace-compact-") as stage:
            local = os.path.join(stage, unit.name)
            out.entry, builder = _write_compacted(local, table, schema)
            try:
                if builder is not None:
                    write_shard_index(local, builder)
            except Exception as exc:
                warn_no_index(d.full(unit.name), exc)
            os.replace(local, local + ".tmp")
            upload_file(local + ".tmp", d.path)
            if os.path.exists(shard_index_path(local)):
                try:
                    upload_file(shard_index_path(local), d.path)
                except Exception as exc:
                    warn_no_index(d.full(unit.name), exc)
    d.sync()
    return out


def _commit_merge(d: _Dir, result: MergeResult, index: dict[str, Any], report: CompactReport) -> None:
    """Make a merge visible (steps 2-3 of the module docstring) and count it in ``report``."""
    report.skipped_open.extend(result.skipped_open)
    report.set_aside.extend(result.set_aside)
    if result.entry is None:
        return
    name = result.unit.name
    index["files"][name] = {
        **result.entry,
        "replaces": [os.path.basename(_uri.strip_query(f)) for f in result.inputs],
        "group": [name],
        REPLACED_AT: time.time(),
    }
    d.save_index(index)
    d.replace(name + ".tmp", name)
    d.sync()
    if result.index is not None:  # after the rename: the index names the file
        try:
            write_shard_index(d.full(name), result.index)
        except Exception as exc:  # the file is read whole instead
            warn_no_index(d.full(name), exc)
    report.files_in += len(result.inputs)
    report.files_out += 1
    report.rows += result.rows
    report.bytes_in += result.bytes_in
    report.bytes_out += result.entry["size"]


def _finish_dir(d: _Dir, index: dict[str, Any], report: CompactReport, delete_after_s: float) -> None:
    """Step 4 of the module docstring, once for every merge of the directory; then the run's rollup."""
    _finish_interrupted(d, index, report, delete_after_s)
    if not d.remote:
        closed.update_rollup(d.path)  # the files it covered are gone: it now covers the compacted ones


def _finish_interrupted(d: _Dir, index: dict[str, Any], report: CompactReport, delete_after_s: float) -> None:
    """Bring the directory to a consistent state after a compaction stopped at any step: a group of outputs that all
    exist (or whose ``.tmp`` is renamed now) deletes its originals; any other's entries and partial outputs go."""
    changed = False
    groups = dict.fromkeys(tuple(entry.get("group", [name])) for name, entry in index["files"].items())
    for group in groups:
        if not all(d.exists(g) or d.exists(g + ".tmp") for g in group):
            for g in group:
                for q in (g, g + ".tmp", _index_name(g)):
                    d.remove(q)
                index["files"].pop(g, None)
            changed = True
            continue
        for g in group:
            if not d.exists(g):
                d.replace(g + ".tmp", g)
        d.sync()
        doomed = [old for g in group for old in index["files"].get(g, {}).get("replaces", [])]
        if not doomed:
            continue
        release = d.may_delete([index["files"].get(g, {}) for g in group], delete_after_s)
        if release is None:  # readers may still hold the originals: the index hides them; delete next time
            report.deferred += len(doomed)
            continue
        try:
            for old in doomed:
                d.remove(old)
                if not d.remote:  # the shard's index (tracer.index.shard) goes with it
                    with contextlib.suppress(OSError):
                        d.remove(_index_name(old))
            for g in group:
                index["files"].get(g, {})["replaces"] = []
            d.sync()
            d.save_index(index)
            changed = False
        finally:
            release()
    if changed:
        d.sync()
        d.save_index(index)


def _write_compacted(path: str, table: pa.Table, schema: pa.Schema) -> tuple[dict[str, Any], ShardIndexBuilder | None]:
    """Write ``table`` to the local ``path``, one step per batch; its index entry and shard index (None: too big)."""
    batch_steps: list[int | None] = []
    builder: ShardIndexBuilder | None = _shard.builder(bounded=False)  # ``table`` is held whole anyway
    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", 3))
    runs = pc.run_end_encode(table.column(S.STEP).combine_chunks())
    with open(path, "wb") as sink:
        with pa.ipc.new_file(sink, schema, options=options) as writer:
            start = 0
            for end, step in zip(runs.run_ends.to_pylist(), runs.values.to_pylist()):
                for off in range(start, end, MAX_BATCH_ROWS):
                    batch = table.slice(off, min(MAX_BATCH_ROWS, end - off)).combine_chunks().to_batches()[0]
                    writer.write_batch(batch)
                    batch_steps.append(step)
                    if builder is not None:
                        try:
                            builder.add(batch)
                        except MemoryError:  # too large to summarise here: no index, read whole
                            builder = None
                start = end
        written = sink.tell()
        sink.flush()
        os.fsync(sink.fileno())
    size = os.path.getsize(path)
    if size != written:
        raise OSError(f"{path}: {size} bytes stored, {written} written")
    return {"size": size, "rows": table.num_rows, "batch_steps": batch_steps, "format": "ipc-file"}, builder


#: Where ``compact --format parquet`` writes, under the path compacted, and (on object stores) the empty object
#: written last into it (Spark's convention).
PARQUET_DIR = "parquet"
PARQUET_DONE = "_SUCCESS"


def write_parquet(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> tuple[str, int]:
    """Write the spans :func:`tracer.read_spans` returns under ``path`` as a Hive-style step-partitioned zstd Parquet
    dataset (no step: ``step=__HIVE_DEFAULT_PARTITION__``); return (directory, rows). ``out`` (default ``path/parquet``)
    is replaced: written beside and renamed in; on object stores written in place, then an empty ``_SUCCESS``."""
    import pyarrow.dataset as pds  # heavy (BENCHMARKS.md, `import tracer`): loaded by its one user, here

    src = os.fspath(path)
    if not _uri.is_remote(src) and not os.path.isdir(src):
        raise FileNotFoundError(f"trace path {src!r} is not a directory; give the directory of a run")
    if out is not None:
        target = os.fspath(out)
    else:
        target = _uri.join_uri(src, PARQUET_DIR) if _uri.is_remote(src) else os.path.join(src, PARQUET_DIR)
    counted = [0]

    def batches() -> Any:
        for _, batch in iter_batches(src):
            counted[0] += batch.num_rows
            yield batch

    reader = pa.RecordBatchReader.from_batches(S.SPAN_SCHEMA, batches())
    options = pds.ParquetFileFormat().make_write_options(compression="zstd")
    write = functools.partial(
        pds.write_dataset,
        format="parquet",
        partitioning=pds.partitioning(pa.schema([S.SPAN_SCHEMA.field(S.STEP)]), flavor="hive"),
        file_options=options,
        basename_template="part-{i}.parquet",
        max_rows_per_group=MAX_BATCH_ROWS,
    )
    if _uri.is_remote(target):
        fs, root = _uri.filesystem(target)
        fs.delete_dir_contents(root, missing_dir_ok=True)
        write(reader, root, filesystem=fs, existing_data_behavior="overwrite_or_ignore")
        with fs.open_output_stream(f"{root}/{PARQUET_DONE}") as done:
            done.write(b"")
        return target, counted[0]
    tmp = f"{target}.tmp-{secrets.token_hex(4)}"
    old = f"{target}.old-{secrets.token_hex(4)}"
    write(reader, tmp)
    with contextlib.suppress(FileNotFoundError):
        os.replace(target, old)
    os.replace(tmp, target)
    fsync_dir(os.path.dirname(os.path.abspath(target)))
    shutil.rmtree(old, ignore_errors=True)
    return target, counted[0]
