"""Readers: spans and trajectories back from trace files, tolerant of damage.

A trace file a killed writer left behind is read up to its last complete
batch with a :class:`TraceFileWarning` that says how much was recovered;
empty, foreign or corrupt files are skipped with a warning. Readers never
raise for a damaged file, only for a path that does not exist.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S
from tracer.storage import remote as _remote
from tracer.storage.index import INDEX_NAME, batches_for_steps, is_arrow_file_format, load_index, replaced_files


class TraceFileWarning(UserWarning):
    """A trace file was damaged, empty or unreadable; the message says what was kept."""


def list_trace_files(path: str | os.PathLike[str]) -> list[str]:
    """Trace files under ``path`` (a file, or a directory searched recursively), sorted.

    Files that a finished compaction replaced (see ``tracer.storage.index``) are left out.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    p = os.fspath(path)
    if _remote.is_remote(p):
        remote = _remote.list_remote(p)
        hidden_in: dict[str, set[str]] = {}
        for uri in remote:
            parent = os.path.dirname(uri)
            if parent not in hidden_in:
                hidden_in[parent] = replaced_files(parent, load_index(parent))
        return [u for u in remote if os.path.basename(u) not in hidden_in[os.path.dirname(u)]]
    if os.path.isfile(p):
        return [p]
    if not os.path.isdir(p):
        raise FileNotFoundError(f"trace path {p!r} does not exist; give a .arrow file or a directory of them")
    found: list[str] = []
    for root, dirs, files in os.walk(p):
        dirs.sort()
        names = sorted(f for f in files if f.endswith(S.FILE_SUFFIX))
        if INDEX_NAME in files:
            hidden = replaced_files(root, load_index(root))
            names = [n for n in names if n not in hidden]
        found.extend(os.path.join(root, n) for n in names)
    return found


def _major(version: str) -> int:
    try:
        return int(version.split(".", 1)[0])
    except ValueError:
        return -1


def read_file_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The schema-level metadata of one trace file (schema version, config, host, ...)."""
    schema = read_schema(os.fspath(path))
    return {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}


def iter_batches(
    path: str | os.PathLike[str], columns: Iterable[str] | None = None, steps: Iterable[int] | None = None
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Yield ``(file, batch)`` for every readable batch under ``path``.

    Only ``columns`` are decompressed (all when None). Columns a file lacks
    (an older format) come back as nulls. With ``steps``, batches of
    compacted files that the index says hold other steps are not read at
    all; other batches still need filtering by the caller.
    """
    wanted = list(S.SPAN_COLUMNS if columns is None else columns)
    unknown = [c for c in wanted if c not in S.SPAN_COLUMNS]
    if unknown:
        raise ValueError(f"unknown column(s) {', '.join(unknown)}; columns are {', '.join(S.SPAN_COLUMNS)}")
    step_set = None if steps is None else set(steps)
    indexes: dict[str, dict[str, Any]] = {}
    for file in list_trace_files(path):
        run_dir = os.path.dirname(file)
        if run_dir not in indexes:
            indexes[run_dir] = load_index(run_dir)
        entry = indexes[run_dir]["files"].get(os.path.basename(file), {})
        yield from ((file, b) for b in _read_file(file, wanted, entry, step_set))


def _read_file(
    file: str, wanted: list[str], entry: dict[str, Any] | None = None, steps: set[int] | None = None
) -> Iterator[pa.RecordBatch]:
    try:
        size = _remote.file_size(file)
    except OSError as exc:
        warnings.warn(f"{file}: skipped, cannot stat: {exc}", TraceFileWarning, stacklevel=3)
        return
    if size == 0:
        warnings.warn(f"{file}: skipped, empty file (0 bytes)", TraceFileWarning, stacklevel=3)
        return
    file_format = is_arrow_file_format(file)
    try:
        schema = read_schema(file, file_format)
    except (OSError, pa.ArrowException) as exc:
        warnings.warn(f"{file}: skipped, not a readable trace file: {exc}", TraceFileWarning, stacklevel=3)
        return
    meta = schema.metadata or {}
    version = meta.get(S.META_SCHEMA_VERSION.encode(), b"").decode()
    if not version:
        warnings.warn(f"{file}: skipped, not a rollout-trace file (no schema version)", TraceFileWarning, stacklevel=3)
        return
    if _major(version) > _major(S.SCHEMA_VERSION):
        warnings.warn(
            f"{file}: skipped, written in format {version}, newer than this reader's {S.SCHEMA_VERSION}; "
            f"upgrade rollout-trace",
            TraceFileWarning,
            stacklevel=3,
        )
        return
    present = [c for c in wanted if c in schema.names]
    options = pa.ipc.IpcReadOptions(included_fields=[schema.get_field_index(c) for c in present])
    out_schema = pa.schema([S.SPAN_SCHEMA.field(c) for c in wanted])
    batches = rows = 0
    try:
        if file_format:
            chosen = batches_for_steps(entry or {}, size, steps)
            with _remote.open_input(file) as f:
                reader = pa.ipc.open_file(f, options=options)
                for i in range(reader.num_record_batches) if chosen is None else chosen:
                    batch = reader.get_batch(i)
                    batches += 1
                    rows += batch.num_rows
                    yield _conform(batch, wanted, out_schema)
            return
        with _remote.open_input(file) as f:
            stream = pa.ipc.open_stream(f, options=options)
            while True:
                try:
                    batch = stream.read_next_batch()
                except StopIteration:
                    return
                batches += 1
                rows += batch.num_rows
                yield _conform(batch, wanted, out_schema)
    except (OSError, pa.ArrowException) as exc:
        warnings.warn(
            f"{file}: damaged after {batches} complete batch(es); recovered {rows} span(s) "
            f"({type(exc).__name__}: {exc})",
            TraceFileWarning,
            stacklevel=3,
        )


def read_schema(file: str, file_format: bool | None = None) -> pa.Schema:
    """The schema (with metadata) of a trace file, stream or IPC file."""
    if file_format is None:
        file_format = is_arrow_file_format(file)
    with _remote.open_input(file) as f:
        return pa.ipc.open_file(f).schema if file_format else pa.ipc.open_stream(f).schema


def _conform(batch: pa.RecordBatch, wanted: list[str], schema: pa.Schema) -> pa.RecordBatch:
    names = batch.schema.names
    arrays = []
    for c in wanted:
        if c in names:
            arr = batch.column(names.index(c))
            target = schema.field(c).type
            arrays.append(arr if arr.type == target else arr.cast(target))
        else:
            arrays.append(pa.nulls(batch.num_rows, schema.field(c).type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _as_set(value: Any) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes, int)):
        return [value]
    return list(value)


def read_spans(
    path: str | os.PathLike[str],
    columns: Iterable[str] | None = None,
    steps: int | Iterable[int] | None = None,
    validate: bool | None = None,
    trace_ids: str | Iterable[str] | None = None,
) -> pa.Table:
    """Read spans from a trace file or a directory tree of them.

    Args:
        path: A ``.arrow`` file or a directory searched recursively.
        columns: Columns to return (default all); only these (and the
            filter columns) are decompressed.
        steps: Keep spans of this step or these steps.
        validate: Keep only validation (True) or training (False) spans.
        trace_ids: Keep spans of these trajectories.

    Returns:
        A table with the requested columns of :data:`tracer.SPAN_SCHEMA`.
    """
    out_cols = list(S.SPAN_COLUMNS if columns is None else columns)
    step_set = _as_set(steps)
    trace_set = _as_set(trace_ids)
    read_cols = list(out_cols)
    for needed, active in ((S.STEP, step_set), (S.VALIDATE, validate), (S.TRACE_ID, trace_set)):
        if active is not None and needed not in read_cols:
            read_cols.append(needed)
    pieces: list[pa.RecordBatch] = []
    for _, batch in iter_batches(path, read_cols, steps=step_set):
        mask = None
        if step_set is not None:
            mask = pc.is_in(batch.column(S.STEP), value_set=pa.array(step_set, pa.int64()))
        if validate is not None:
            m = pc.equal(pc.fill_null(batch.column(S.VALIDATE), False), validate)
            mask = m if mask is None else pc.and_(mask, m)
        if trace_set is not None:
            m = pc.is_in(batch.column(S.TRACE_ID), value_set=pa.array(trace_set, pa.string()))
            mask = m if mask is None else pc.and_(mask, m)
        if mask is not None:
            batch = batch.filter(pc.fill_null(mask, False))
        if batch.num_rows:
            pieces.append(batch.select(out_cols))
    schema = pa.schema([S.SPAN_SCHEMA.field(c) for c in out_cols])
    return pa.Table.from_batches(pieces, schema=schema)


def parse_json(text: str | None) -> Any:
    """Parse one of the JSON columns (inputs, outputs, attributes, error); None stays None."""
    return None if text is None else json.loads(text)
