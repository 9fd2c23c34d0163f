"""Shard indexes: ``_{shard name}.index`` beside each closed shard, so reading cost follows the question.

An uncompressed Arrow IPC file of :data:`INDEX_SCHEMA`: a row per trajectory (:func:`tracer.summary.summarize`
plus its batches, :data:`tracer.schema.INDEX_UNIFORM` and :func:`trace_hashes`), a row with an empty trace id
listing the batches of keyed rewards, a row with a null trace id per key of those, and :data:`SORTED_COLUMNS`.
Its metadata (version, the shard's name, size and footer digest, each batch's rows and steps, the per-step
partials) must agree with the shard on disk, else the index is ignored and the spans are read. The leading
``_`` hides it from ``pyarrow.dataset`` discovery.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, TypeVar

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S
from tracer import summary as model
from tracer.storage import side_files
from tracer.storage.files import closed_file_metadata, footer_bytes, read_batches, write_replacing

#: Version of the shard index layout; another value is ignored (the spans are read instead).
INDEX_VERSION = "3"
#: ``_{shard name}{INDEX_SUFFIX}`` beside the shard.
INDEX_SUFFIX = ".index"
#: Trajectory rows are stored in this many record batches by a hash of their trace id (rows without one in one
#: more), so a lookup reads one batch. Few: a batch costs ~15 us besides its rows, and the overview reads all.
INDEX_BUCKETS = 8
#: Asking for more buckets than this reads the whole lookup once (and keeps it).
MAX_BUCKET_READS = 8
#: Parsed shard indexes kept per process (keyed by the shard's and the shard index's size and mtime).
CACHE_ENTRIES = 1024
#: Most bytes of summary columns a writer keeps until close; a file that holds more gets no index.
MAX_BUILD_BYTES = 128 * 1024 * 1024
#: A shard with more distinct span names than this stores none (readers then read its name column).
MAX_INDEX_NAMES = 1024
#: :func:`step_sources` copies the wanted columns of shard indexes up to this size, maps larger ones whole.
SMALL_INDEX_BYTES = 512 * 1024

#: Columns of a shard index: the trajectory summary and where each trace id's batches are.
INDEX_SCHEMA = pa.schema(
    [
        *S.TRAJECTORY_SCHEMA,
        pa.field(S.INDEX_BATCHES, pa.list_(pa.int32())),
        pa.field(S.INDEX_UNIFORM, pa.bool_()),
        pa.field(S.INDEX_TRACE_HASH, pa.uint64()),
        pa.field(S.INDEX_SORTED_REWARDS, pa.float64()),
        pa.field(S.INDEX_SORTED_LATENCIES, pa.float64()),
    ]
)
#: Columns of a shard index not aligned with its rows: the values of the stored per-step aggregates, sorted.
SORTED_COLUMNS = (S.INDEX_SORTED_REWARDS, S.INDEX_SORTED_LATENCIES)

#: Span table to trajectory rows (:func:`tracer.summary.summarize`).
Summarizer = Callable[[pa.Table], pa.Table]
#: Trajectory rows to rows of :data:`tracer.schema.STEP_PARTIALS_SCHEMA` (:func:`tracer.summary.step_partials`).
PartialsOf = Callable[[pa.Table], pa.Table]


def shard_index_path(shard: str) -> str:
    """Where the index of ``shard`` lives."""
    folder, name = os.path.split(shard)
    return os.path.join(folder, "_" + name + INDEX_SUFFIX)


def bucket_of(trace_id: str, buckets: int) -> int:
    """The bucket of a shard index holding ``trace_id``'s row (CRC-32 of its UTF-8, modulo ``buckets``)."""
    return zlib.crc32(trace_id.encode("utf-8", "surrogatepass")) % buckets


def trace_hashes(trace_ids: pa.Array) -> pa.Array:
    """:data:`tracer.schema.INDEX_TRACE_HASH` of each trace id (null for a null or ``""`` id): CRC-32 of its UTF-8
    in the high 32 bits, Adler-32 in the low ones; cheap, not strong: equal hashes only say to compare the ids."""
    data = [t.encode("utf-8", "surrogatepass") if t else None for t in trace_ids.to_pylist()]
    high = np.fromiter((zlib.crc32(d) if d else 0 for d in data), dtype=np.uint64, count=len(data))
    low = np.fromiter((zlib.adler32(d) if d else 0 for d in data), dtype=np.uint64, count=len(data))
    missing = np.fromiter((d is None for d in data), dtype=bool, count=len(data))
    return pa.array((high << np.uint64(32)) | low, pa.uint64(), mask=missing)


def _digest(footer: bytes) -> str:
    return hashlib.blake2b(footer, digest_size=16).hexdigest()


class ShardIndexBuilder:
    """What a writer collects for the index of the file it is writing. ``columns`` (what ``summarize`` needs) are kept
    per batch until close, at most :data:`MAX_BUILD_BYTES` when ``bounded`` (False where the caller holds the whole
    table anyway: compaction). ``step_partials``' counts and sums go in the metadata, its values sorted in
    :data:`SORTED_COLUMNS`."""

    def __init__(
        self, columns: Sequence[str], summarize: Summarizer, step_partials: PartialsOf, bounded: bool = True
    ) -> None:
        self.columns = list(columns)
        self.summarize = summarize
        self.step_partials = step_partials
        self.bounded = bounded
        self.parts: list[pa.RecordBatch] = []
        self.batch_rows: list[int] = []
        self.batch_steps: list[list[int | None]] = []
        self.names: set[str] | None = set()
        self.nbytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Note a batch just written, in file order (MemoryError: a bounded builder outgrew :data:`MAX_BUILD_BYTES`)."""
        part = batch.select(self.columns)
        self.nbytes += part.nbytes
        if self.bounded and self.nbytes > MAX_BUILD_BYTES:
            raise MemoryError(f"a shard index would keep over {MAX_BUILD_BYTES} bytes")
        self.parts.append(part)
        self.batch_rows.append(batch.num_rows)
        steps = pc.unique(batch.column(S.STEP)).to_pylist()
        self.batch_steps.append(sorted(steps, key=lambda s: (s is None, s or 0)))
        if self.names is not None and S.NAME in batch.schema.names:
            self.names.update(n for n in pc.unique(batch.column(S.NAME)).to_pylist() if isinstance(n, str))
        if S.NAME not in batch.schema.names or len(self.names or ()) > MAX_INDEX_NAMES:
            self.names = None

    def build(self) -> pa.Table:
        """The index table of the batches added (see the module docstring)."""
        spans = pa.Table.from_batches(self.parts, schema=self.parts[0].schema) if self.parts else None
        if spans is None or spans.num_rows == 0:
            return INDEX_SCHEMA.empty_table()
        if spans.column(S.TRACE_ID).null_count:
            raise ValueError("null trace ids: readers could not tell which batches hold them")
        numbers = np.repeat(np.arange(len(self.batch_rows), dtype=np.int32), self.batch_rows)
        of_batches = pa.table(
            {
                S.TRACE_ID: spans.column(S.TRACE_ID),
                S.INDEX_BATCHES: pa.array(numbers, pa.int32()),
                S.STEP: spans.column(S.STEP),
                S.VALIDATE: pc.fill_null(spans.column(S.VALIDATE), False),
            }
        )
        per_trace = of_batches.group_by(S.TRACE_ID, use_threads=False).aggregate(
            [
                (S.INDEX_BATCHES, "distinct"),
                (S.STEP, "count_distinct", pc.CountOptions(mode="all")),
                (S.VALIDATE, "count_distinct", pc.CountOptions(mode="all")),
            ]
        )
        ids = per_trace.column(S.TRACE_ID).combine_chunks()
        lists = per_trace.column(f"{S.INDEX_BATCHES}_distinct").combine_chunks()
        uniform = pc.and_(
            pc.equal(per_trace.column(f"{S.STEP}_count_distinct"), 1),
            pc.equal(per_trace.column(f"{S.VALIDATE}_count_distinct"), 1),
        )
        summary = self.summarize(spans)
        at = pc.index_in(summary.column(S.TRACE_ID), value_set=ids)
        parts = [
            summary.append_column(S.INDEX_BATCHES, pc.take(lists, at))
            .append_column(S.INDEX_UNIFORM, pc.take(uniform, at))
            .append_column(S.INDEX_TRACE_HASH, trace_hashes(summary.column(S.TRACE_ID).combine_chunks()))
            .append_column(S.INDEX_SORTED_REWARDS, pa.nulls(summary.num_rows, pa.float64()))
            .append_column(S.INDEX_SORTED_LATENCIES, pa.nulls(summary.num_rows, pa.float64()))
        ]
        no_id = pc.equal(ids, "")
        if pc.any(no_id).as_py():
            parts.append(_rows_of(1, {S.TRACE_ID: pa.array([""]), S.INDEX_BATCHES: pc.filter(lists, no_id)}))
            key_cols = [S.STEP, S.SAMPLE_INDEX, S.ROLLOUT_N, S.VALIDATE]
            keyed = spans.filter(pc.equal(spans.column(S.TRACE_ID), "")).select(key_cols)
            keys = keyed.group_by(key_cols, use_threads=False).aggregate([])
            parts.append(_rows_of(keys.num_rows, {c: keys.column(c) for c in key_cols}))
        return pa.concat_tables([p.cast(INDEX_SCHEMA) for p in parts])


def _rows_of(n: int, columns: dict[str, Any]) -> pa.Table:
    """``n`` index rows with ``columns`` and nulls elsewhere."""
    return pa.table({c: columns.get(c, pa.nulls(n, f.type)) for c, f in zip(INDEX_SCHEMA.names, INDEX_SCHEMA)})


def write_shard_index(shard: str, builder: ShardIndexBuilder) -> None:
    """Write the index of the closed ``shard`` beside it (temp file, fsync, rename). Raises OSError, ValueError or
    pyarrow.ArrowException: the caller drops the index (readers read the spans)."""
    footer = footer_bytes(shard)
    if footer is None or footer[1] != len(builder.batch_rows):
        raise ValueError(f"{shard}: no footer listing its {len(builder.batch_rows)} batches")
    table = builder.build()
    steps_text, sorted_values = _steps_meta(table, builder.step_partials)
    meta = {
        S.META_INDEX_VERSION: INDEX_VERSION,
        S.META_INDEX_OF: os.path.basename(shard),
        S.META_INDEX_SIZE: str(os.path.getsize(shard)),
        S.META_INDEX_FOOTER: _digest(footer[0]),
        S.META_INDEX_BATCH_ROWS: json.dumps(builder.batch_rows),
        S.META_INDEX_BATCH_STEPS: json.dumps(builder.batch_steps),
        S.META_INDEX_BUCKETS: str(INDEX_BUCKETS),
        S.META_INDEX_STEPS: steps_text,
    }
    if builder.names is not None:
        meta[S.META_INDEX_NAMES] = json.dumps(sorted(builder.names))
    ids = table.column(S.TRACE_ID).to_pylist()
    place = np.array([INDEX_BUCKETS if t is None else bucket_of(t, INDEX_BUCKETS) for t in ids], dtype=np.int64)
    order = np.argsort(place, kind="stable")
    counts = np.bincount(place, minlength=INDEX_BUCKETS + 1)
    table = table.take(pa.array(order)).combine_chunks()
    for name, values in zip(SORTED_COLUMNS, sorted_values, strict=True):
        padded = pa.concat_arrays([values, pa.nulls(table.num_rows - len(values), pa.float64())])
        table = table.set_column(table.schema.get_field_index(name), INDEX_SCHEMA.field(name), padded)
    whole = table.to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=INDEX_SCHEMA)

    def write(f: BinaryIO) -> None:
        # Uncompressed: readers decode nothing (the landing page reads every row).
        with pa.ipc.new_file(f, INDEX_SCHEMA.with_metadata(meta)) as w:
            for at, n in zip((np.cumsum(counts) - counts).tolist(), counts.tolist()):  # batch i is bucket i
                w.write_batch(whole.slice(at, n))

    target = shard_index_path(shard)
    write_replacing(target, target + ".tmp", write)


def builder(bounded: bool = True) -> ShardIndexBuilder:
    """A builder with the trajectory model's summary and per-step aggregates (:mod:`tracer.summary`)."""
    return ShardIndexBuilder(model.SUMMARY_SPAN_COLUMNS, model.summarize, model.step_partials, bounded=bounded)


logger = logging.getLogger("rollout_trace")
_index_warned = threading.Event()


def write_index(shard: str) -> bool:
    """Write the index of the closed local ``shard`` from its spans read back; True when it was written. Reads only the
    summary's columns (at most :data:`MAX_BUILD_BYTES`). Never raises: the first failure in a process is logged, and a
    shard without an index is read whole."""
    try:
        b = builder()
        reading = read_batches(shard, list(dict.fromkeys([*b.columns, S.STEP])))
        for batch in reading:
            b.add(batch)
        if not reading.result.complete:
            raise ValueError(reading.result.describe() or "not read completely")
        write_shard_index(shard, b)
    except Exception as exc:  # the shard stands without an index: readers read the spans
        warn_no_index(shard, exc)
        return False
    return True


def warn_no_index(shard: str, exc: BaseException) -> None:
    """Log, once per process, that ``shard`` got no index; later calls log nothing."""
    if _index_warned.is_set():
        return
    _index_warned.set()
    why = "readers read its spans instead (further failures to write an index are not logged)"
    logger.warning("rollout-trace: no index written for %s (%s: %s); %s", shard, type(exc).__name__, exc, why)


@dataclasses.dataclass
class ShardIndex:
    """The index of one closed shard, checked against the shard on disk. ``size`` is the shard's (``expect_size`` of
    :func:`tracer.storage.files.read_batches`); ``batch_steps`` the distinct steps of each batch (None: spans outside
    any step); ``names`` None when the index does not say."""

    shard: str
    size: int
    batch_rows: list[int]
    batch_steps: list[list[int | None]]
    _path: str
    _buckets: int
    names: frozenset[str] | None = None
    _table: pa.Table | None = None
    _lookup: pa.Table | None = None
    _bad: bool = False
    #: :data:`tracer.schema.META_INDEX_STEPS` as the check read it (the stored aggregates, undecoded).
    _steps_text: str | None = None

    def batches_of_steps(self, steps: set[int]) -> list[int]:
        """Batches holding any of ``steps`` (None among them: spans outside any step, as ``pyarrow.compute.is_in``)."""
        return [i for i, have in enumerate(self.batch_steps) if not steps.isdisjoint(have)]

    def steps(self) -> set[int]:
        """Every step of the shard."""
        return {s for have in self.batch_steps for s in have if s is not None}

    def table(self) -> pa.Table | None:
        """The rows (see the module docstring); None when the shard index turns out unreadable or inconsistent."""
        if self._table is None and not self._bad:
            self._table = _read_table(self._path, len(self.batch_rows))
            self._bad = self._table is None
        return self._table

    def batches_of_traces(self, trace_ids: pa.Array) -> list[int] | None:
        """Batches holding any of ``trace_ids`` (empty when none does); None when the table is unusable."""
        table = self._table if self._table is not None else self._lookup
        if table is None and not self._bad:
            wanted = sorted({bucket_of(t, self._buckets) for t in trace_ids.to_pylist() if t is not None})
            table = _read_buckets(self, wanted) if len(wanted) <= MAX_BUCKET_READS else None
            if table is None:  # the two columns a lookup needs, kept for the next one
                self._lookup = table = _read_table(self._path, len(self.batch_rows), LOOKUP_COLUMNS)
                self._bad = table is None
        if table is None:
            return None
        hit = table.filter(pc.fill_null(pc.is_in(table.column(S.TRACE_ID), value_set=trace_ids), False))
        return sorted(set(pc.list_flatten(hit.column(S.INDEX_BATCHES)).to_pylist()))


#: The columns :meth:`ShardIndex.batches_of_traces` reads.
LOOKUP_COLUMNS = (S.TRACE_ID, S.INDEX_BATCHES)


#: Shard indexes kept open between lookups (one file descriptor each), most recently used last.
OPEN_READERS = 64
_open: collections.OrderedDict[str, tuple[ShardIndex, Any, Any]] = collections.OrderedDict()


def _bucket_reader(index: ShardIndex) -> Any:
    """An open reader of ``index``'s shard index (lookup columns only), kept for the next lookup."""
    with _cache_lock:
        held = _open.get(index._path)
        if held is not None and held[0] is index:
            _open.move_to_end(index._path)
            return held[2]
    fields = [INDEX_SCHEMA.get_field_index(c) for c in LOOKUP_COLUMNS]
    source = pa.OSFile(index._path)
    try:
        reader = pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(included_fields=fields))
    except BaseException:
        source.close()
        raise
    with _cache_lock:
        old = _open.pop(index._path, None)
        _open[index._path] = (index, source, reader)
        gone = [old] if old is not None else []
        while len(_open) > OPEN_READERS:
            gone.append(_open.popitem(last=False)[1])
    for _, f, _ in gone:
        f.close()
    return reader


def _read_buckets(index: ShardIndex, wanted: list[int]) -> pa.Table | None:
    """The lookup columns of some buckets' record batches; None when the shard index is not laid out so."""
    expected = pa.schema([INDEX_SCHEMA.field(c) for c in LOOKUP_COLUMNS])
    try:
        reader = _bucket_reader(index)
        if reader.num_record_batches != index._buckets + 1:
            return None
        table = pa.Table.from_batches([reader.get_batch(b) for b in wanted], schema=expected)
    except (OSError, ValueError, pa.ArrowException):
        return None
    return checked_table(table, expected, len(index.batch_rows))


def _read_table(path: str, batches: int, columns: Sequence[str] | None = None) -> pa.Table | None:
    fields = None if columns is None else [INDEX_SCHEMA.get_field_index(c) for c in columns]
    expected = INDEX_SCHEMA if fields is None else pa.schema([INDEX_SCHEMA.field(i) for i in fields])
    try:
        with pa.OSFile(path) as source:
            table = pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(included_fields=fields)).read_all()
    except (OSError, ValueError, pa.ArrowException):
        return None
    return checked_table(table, expected, batches)


def _steps_meta(table: pa.Table, step_partials: PartialsOf) -> tuple[str, tuple[pa.Array, pa.Array]]:
    """The counts and sums of ``table``'s per-step aggregates as metadata text, and their rewards and latencies
    sorted per group in row order (what :data:`SORTED_COLUMNS` hold before their nulls)."""
    tid = table.column(S.TRACE_ID)
    rows = table.filter(pc.fill_null(pc.not_equal(tid, ""), False)).select(list(S.TRAJECTORY_COLUMNS))
    partials = step_partials(rows)
    if partials.schema.remove_metadata() != S.STEP_PARTIALS_SCHEMA:
        raise ValueError(f"per-step aggregates of schema {partials.schema}, not {S.STEP_PARTIALS_SCHEMA}")
    lists = [partials.column(c).combine_chunks() for c in (S.PART_REWARDS, S.PART_LATENCIES)]
    values = (pc.list_flatten(lists[0]).cast(pa.float64()), pc.list_flatten(lists[1]).cast(pa.float64()))
    counts = [pc.list_value_length(v).to_pylist() for v in lists]
    empty = pa.array([[]] * partials.num_rows, pa.list_(pa.float64()))
    for c in (S.PART_REWARDS, S.PART_LATENCIES):  # stored empty: the values are the sorted columns
        at = partials.schema.get_field_index(c)
        partials = partials.set_column(at, partials.schema.field(at), empty)
    meta = {S.META_STEPS_VALUE_COUNTS: json.dumps(counts)}
    if rows.num_rows:
        least, greatest = pc.min_max(rows.column(S.TRACE_ID)).values()
        meta[S.META_STEPS_TRACE_RANGE] = json.dumps([least.as_py(), greatest.as_py()])
    if tid.null_count:  # rows of the keys of spans without a trace id
        meta[S.META_STEPS_LOOSE] = json.dumps(pc.unique(pc.filter(table.column(S.STEP), pc.is_null(tid))).to_pylist())
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, S.STEP_PARTIALS_SCHEMA.with_metadata(meta)) as w:
        w.write_table(partials)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii"), values


@dataclasses.dataclass(frozen=True)
class StoredPartials:
    """The per-step aggregates stored in a shard's index (value lists empty), and what says whether other files
    can change them: the least and greatest trace id (None: no trajectory), the steps of keyed rewards (None:
    none), and how many rewards (row 0) and latencies (row 1) of each row :data:`SORTED_COLUMNS` hold (None:
    not said)."""

    partials: pa.Table
    trace_range: tuple[str, str] | None
    keyed_steps: list[int | None] | None
    value_counts: np.ndarray | None = None


def stored_step_partials(index: ShardIndex) -> StoredPartials | None:
    """The per-step aggregates stored in ``index``'s metadata; None when it holds none, they do not decode or it
    is unreadable (the caller then aggregates the shard's trajectory rows)."""
    return step_sources(index, ())[0]


def step_sources(index: ShardIndex, columns: Sequence[str]) -> tuple[StoredPartials | None, pa.Table | None]:
    """:func:`stored_step_partials` and :func:`index_columns` of one shard index, opened once. The columns come back as
    one table of the shard index's record batches (memory-mapped: fixed-width columns are not copied), None when it is
    unreadable; with no ``columns``, None."""
    fields = [INDEX_SCHEMA.get_field_index(c) for c in columns]
    try:
        with pa.memory_map(index._path) as source:
            # Large: every column from a memory map that copies nothing (``included_fields`` copies each batch's
            # whole body). Small: ``included_fields``, cheaper than wrapping every column. Nothing to decode.
            whole = source.size() > SMALL_INDEX_BYTES
            options = pa.ipc.IpcReadOptions(included_fields=None if whole else fields, use_threads=False)
            reader = pa.ipc.open_file(source, options=options)
            text = (reader.schema.metadata or {}).get(S.META_INDEX_STEPS.encode())
            table = None
            if columns:
                table = reader.read_all()
                if whole:
                    if table.schema.names != INDEX_SCHEMA.names:
                        return None, None
                    table = table.select(fields)
    except (OSError, ValueError, pa.ArrowException):
        return None, None
    checked = None if table is None else checked_table(table, pa.schema([INDEX_SCHEMA.field(i) for i in fields]))
    return (None if text is None else _decode_partials(text)), checked


#: A fixed-width column of a shard index as numpy: every row's value (anything where null) and which rows are
#: valid (None: all of them).
Fixed = tuple[np.ndarray, "np.ndarray | None"]


def landing_sources(
    index: ShardIndex, columns: Sequence[str], partials: bool = True
) -> tuple[StoredPartials | None, dict[str, Fixed] | None]:
    """:func:`step_sources` for fixed-width columns (:data:`FIXED_COLUMNS`), as numpy arrays: what the run overview
    reads of each file (with no column, the aggregates from the text the index check kept). Without ``partials``,
    no aggregates (None)."""
    if any(c not in FIXED_COLUMNS for c in columns):
        raise ValueError(f"not a fixed-width shard index column: {columns}")
    if not columns:
        text = index._steps_text if partials else None
        return (None if text is None else _decode_partials(text)), None
    got, table = step_sources(index, sorted(set(columns), key=INDEX_SCHEMA.get_field_index))  # in schema order
    return (got if partials else None), None if table is None else {c: _as_fixed(table.column(c)) for c in columns}


def _as_fixed(col: pa.ChunkedArray) -> Fixed:
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    values = np.asarray(pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)) if arr.null_count else arr.to_numpy()
    valid = None if arr.null_count == 0 else np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return np.array(values, copy=True), valid


#: Columns :func:`landing_sources` reads: the fixed-width ones (sorted values, trace id hashes).
FIXED_COLUMNS = frozenset((S.INDEX_TRACE_HASH, *SORTED_COLUMNS))


def checked_table(table: pa.Table, expected: pa.Schema, batches: int | None = None) -> pa.Table | None:
    """``table`` without metadata when it has the ``expected`` columns, validates and (given ``batches``) lists
    only batches below it; else None."""
    # Fixed-width columns have nothing more to check in a full validation (offsets, UTF-8 are for others).
    full = not all(pa.types.is_primitive(f.type) for f in expected)
    try:
        if table.schema.remove_metadata() != expected:
            return None
        for chunk in table.to_batches():
            chunk.validate(full=full)
        if batches is not None:
            flat = pc.list_flatten(table.column(S.INDEX_BATCHES))
            if len(flat) and (pc.min(flat).as_py() < 0 or pc.max(flat).as_py() >= batches):
                return None
        return table.replace_schema_metadata(None)
    except (ValueError, pa.ArrowException):
        return None


def _decode_partials(text: bytes | str) -> StoredPartials | None:
    try:
        raw = pa.ipc.open_stream(pa.py_buffer(base64.b64decode(text, validate=True))).read_all()
        meta = {k.decode(): v.decode() for k, v in (raw.schema.metadata or {}).items()}
        # orjson: the same values as json for what a writer writes, ~10x faster; it refuses more (NaN, 2**64).
        keys = (S.META_STEPS_TRACE_RANGE, S.META_STEPS_LOOSE, S.META_STEPS_VALUE_COUNTS)
        span, keyed, counts = (orjson.loads(meta[k]) if k in meta else None for k in keys)
    except (ValueError, UnicodeDecodeError, pa.ArrowException):
        return None
    table = checked_table(raw, S.STEP_PARTIALS_SCHEMA)
    if table is None:
        return None
    if span is not None and not (isinstance(span, list) and len(span) == 2 and all(isinstance(t, str) for t in span)):
        return None
    if keyed is not None and not (isinstance(keyed, list) and all(v is None or isinstance(v, int) for v in keyed)):
        return None
    if counts is not None:
        counts = _value_counts(counts, table.num_rows)
    return StoredPartials(table, None if span is None else (span[0], span[1]), keyed, counts)


def _value_counts(counts: Any, rows: int) -> np.ndarray | None:
    """:data:`tracer.schema.META_STEPS_VALUE_COUNTS` as JSON gave it, as a (2, rows) array; None when malformed."""
    try:
        out = np.array(counts)
    except ValueError:  # ragged
        return None
    if out.shape != (2, rows) or (rows and (out.dtype != np.int64 or int(out.min()) < 0)):
        return None
    return out.astype(np.int64, copy=False)


_cache: collections.OrderedDict[str, tuple[tuple[int, ...], ShardIndex | None]] = collections.OrderedDict()
_cache_lock = threading.Lock()
_T = TypeVar("_T")


def cached(
    cache: collections.OrderedDict[str, tuple[Any, _T]], key: str, stamp: Any, compute: Callable[[], _T], limit: int
) -> _T:
    """``compute()`` once per ``key`` and ``stamp`` (a file's stat), the ``limit`` latest kept in ``cache``."""
    with _cache_lock:
        hit = cache.get(key)
        if hit is not None and hit[0] == stamp:
            cache.move_to_end(key)
            return hit[1]
    value = compute()
    with _cache_lock:
        cache[key] = (stamp, value)
        while len(cache) > limit:
            cache.popitem(last=False)
    return value


def load_shard_index(shard: str) -> ShardIndex | None:
    """The index of the local, closed ``shard`` when it has one that agrees with it; else None. Checked once per process
    for each (size, mtime) of the shard and of its shard index."""
    side = shard_index_path(shard)
    try:
        st = os.stat(shard)
    except OSError:
        return None
    si = side_files.checked(side, side_files.MAX_ARROW_BYTES)  # no FIFO, link or device is opened below
    if si is None:
        return None
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino, si.st_size, si.st_mtime_ns, si.st_ino)
    return cached(_cache, shard, stamp, lambda: _check(shard, side, st.st_size), CACHE_ENTRIES)


_NONE = type(None)


def _check(shard: str, side: str, size: int) -> ShardIndex | None:
    try:
        got = closed_file_metadata(side) or {}
        said = tuple(got.get(k) for k in (S.META_INDEX_VERSION, S.META_INDEX_OF, S.META_INDEX_SIZE))
        if said != (INDEX_VERSION, os.path.basename(shard), str(size)):
            return None
        footer = footer_bytes(shard)
        if footer is None or got.get(S.META_INDEX_FOOTER) != _digest(footer[0]):
            return None
        rows: Any = orjson.loads(got[S.META_INDEX_BATCH_ROWS])  # orjson: as json, faster, stricter
        steps: Any = orjson.loads(got[S.META_INDEX_BATCH_STEPS])
        if not (isinstance(rows, list) and isinstance(steps, list) and len(rows) == len(steps) == footer[1]):
            return None
        buckets = int(got[S.META_INDEX_BUCKETS])
        # Counts and steps checked by type, not isinstance (a JSON true is a bool), in one cheap pass each.
        if buckets < 1 or (rows and ({type(r) for r in rows} != {int} or min(rows) < 0)):
            return None
        if {type(s) for s in steps} - {list} or {type(v) for v in itertools.chain(*steps)} - {int, _NONE}:
            return None
        names: Any = orjson.loads(got[S.META_INDEX_NAMES]) if S.META_INDEX_NAMES in got else None
        # None when absent or not what a writer writes: the shard's name column answers instead.
        names = frozenset(names) if isinstance(names, list) and {type(n) for n in names} <= {str} else None
    except (OSError, ValueError, KeyError, UnicodeDecodeError, pa.ArrowException):
        return None
    return ShardIndex(shard, size, rows, steps, side, buckets, names, _steps_text=got.get(S.META_INDEX_STEPS))
