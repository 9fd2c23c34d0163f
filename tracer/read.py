"""Readers of trace files: a path or a list of paths (``.arrow`` files, directories searched recursively, URIs).
Damaged, empty or foreign files give a :class:`TraceFileWarning` saying what was kept, never an error; only a
missing path raises. A directory is read as one snapshot while ``rollout-trace compact`` works on it."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S
from tracer.index import rollup as _rollup
from tracer.index.rollup import Rollup
from tracer.index.shard import ShardIndex, load_shard_index, write_index
from tracer.schema import parse_json_or_text as parse_json_or_text
from tracer.storage import uri as _uri
from tracer.storage.files import ends_closed, read_batches, read_schema
from tracer.storage.history import HISTORY_COLUMNS, expand_history
from tracer.storage.index import INDEX_NAME, batches_for_steps, listing, load_index, replaced_files
from tracer.storage.locks import reading
from tracer.storage.seal import seal_if_abandoned
from tracer.storage.writer import OnClose

if TYPE_CHECKING:  # imported where a Dataset is built: 0.2 s of `import tracer` otherwise
    import pyarrow.dataset as pds

#: What every reader accepts: one path or URI, or a sequence of them (files and/or directories).
TracePaths = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]


class TraceFileWarning(UserWarning):
    """A trace file was damaged, empty or unreadable; the message says what was kept."""


def _snapshots(paths: TracePaths, lock: bool) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """``(files, index)`` per directory, in reading order; with ``lock``, its shared lock is held until the next item."""
    seen: set[str] = set()

    def fresh(files: list[str]) -> list[str]:
        out = []
        for f in files:
            key = f if _uri.is_remote(f) else os.path.abspath(f)
            if key not in seen:
                seen.add(key)
                out.append(f)
        return out

    for given in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        p = os.fspath(given)
        if _uri.is_remote(p):
            by_parent: dict[str, list[str]] = {}
            for u in _uri.list_remote(p):
                by_parent.setdefault(os.path.dirname(u), []).append(u)
            for parent, uris in by_parent.items():
                index = load_index(parent)
                hidden = replaced_files(index, {os.path.basename(u) for u in uris})
                yield fresh([u for u in uris if os.path.basename(u) not in hidden]), index
            continue
        if os.path.isfile(p) or (os.path.exists(p) and not os.path.isdir(p)):
            yield fresh([p]), load_index(os.path.dirname(p) or ".")
            continue
        if not os.path.isdir(p):
            raise FileNotFoundError(f"trace path {p!r} does not exist; give a .arrow file or a directory of them")
        for root, dirs, names in os.walk(p):
            dirs.sort()
            if not any(n.endswith(S.FILE_SUFFIX) for n in names) and INDEX_NAME not in names:
                continue
            with reading(root) if lock else contextlib.nullcontext():
                try:
                    names, index = listing(root)
                except OSError:
                    continue
                yield fresh([os.path.join(root, n) for n in names]), index


def list_trace_files(path: TracePaths) -> list[str]:
    """Trace files under ``path``, sorted per directory, once each, without those a compaction replaced
    (FileNotFoundError: no such path)."""
    return [f for files, _ in _snapshots(path, lock=False) for f in files]


def read_file_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The schema-level metadata of one trace file (schema version, config, host, ...)."""
    schema = read_schema(os.fspath(path))
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in (schema.metadata or {}).items()}


def _shard_index(file: str, index: dict[str, Any], on_sealed: OnClose = write_index) -> ShardIndex | None:
    """The index of ``file`` (shard or compacted) when one agrees with it, a dead writer's shard sealed first;
    None for remote files (the check would cost three more requests per object)."""
    if _uri.is_remote(file):
        return None
    found = load_shard_index(file)
    # One that agrees with the footer as it is now: the file is closed; compacted files are closed by their writer.
    if found is not None or os.path.basename(file) in index["files"]:
        return found
    seal_if_abandoned(file, on_sealed=on_sealed)  # a dead writer's shard: the footer it never wrote, its index
    return load_shard_index(file)


def _chosen(
    shard: ShardIndex | None, entry: dict[str, Any], steps: set[int] | None, trace_ids: pa.Array | None
) -> tuple[list[int] | None, int | None]:
    """(batch numbers to read, the file size they are valid for) from ``shard``, else the ``_index.json`` entry;
    (None, None) to read every batch."""
    if shard is None:
        size = entry.get("size")
        return (batches_for_steps(entry, size, steps), size) if isinstance(size, int) else (None, None)
    if steps is None and trace_ids is None:
        return None, None
    chosen = set(range(len(shard.batch_rows)))
    if steps is not None:
        chosen &= set(shard.batches_of_steps(steps))
    if trace_ids is not None and chosen:
        holding = shard.batches_of_traces(trace_ids)
        if holding is None:
            return (None, None) if steps is None else (sorted(chosen), shard.size)
        chosen &= set(holding)
    return sorted(chosen), shard.size


def indexed_files(path: TracePaths, on_sealed: OnClose = write_index) -> list[tuple[str, ShardIndex | None]]:
    """The files :func:`iter_batches` would read, each with its index when one agrees with it (else None);
    ``on_sealed`` gets each dead writer's shard this call seals (FileNotFoundError: no such path)."""
    return [(f, _shard_index(f, index, on_sealed)) for files, index in _snapshots(path, lock=True) for f in files]


def _rolled_up(path: TracePaths) -> Iterator[tuple[Rollup | None, Callable[[], list[tuple[str, ShardIndex | None]]]]]:
    """Per directory under ``path``: its rollup when it covers every file listed there, else None; and
    :func:`indexed_files`' pairs of that directory, checked only when called for."""
    for files, index in _snapshots(path, lock=True):
        local = files and not _uri.is_remote(files[0])
        roll = _rollup.covering(os.path.dirname(files[0]), files) if local else None
        yield roll, functools.partial(_indexed_pairs, files, index)


def _indexed_pairs(files: list[str], index: dict[str, Any]) -> list[tuple[str, ShardIndex | None]]:
    return [(f, _shard_index(f, index)) for f in files]


def run_rollup(path: TracePaths) -> Rollup | None:
    """The rollup of ``path`` when it is one local directory's (no trace files below it) covering all of
    its files (:mod:`tracer.index.rollup`); else None."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        return None
    found = list(_rolled_up(path))
    return found[0][0] if len(found) == 1 else None


def read_steps(path: TracePaths) -> tuple[list[int], int]:
    """The distinct steps of the spans under ``path`` (ascending, None left out) and their row count, from
    rollups and indexes where they can answer, else the files' step column."""
    steps: set[int] = set()
    rows = 0
    plain: list[str] = []
    for roll, pairs in _rolled_up(path):
        if roll is not None:
            steps.update(roll.steps)
            rows += roll.rows
            continue
        for file, shard in pairs():
            if shard is None:
                if _uri.is_remote(file) or os.path.exists(file):  # a dangling link or a file gone since the listing
                    plain.append(file)
            else:
                steps |= shard.steps()
                rows += sum(shard.batch_rows)
    for _, batch in iter_batches(plain, [S.STEP]) if plain else ():
        rows += batch.num_rows
        steps.update(s for s in pc.unique(batch.column(0)).to_pylist() if s is not None)
    return sorted(steps), rows


def has_spans_named(path: TracePaths, name: str) -> bool:
    """Whether any span under ``path`` is named ``name`` (indexes answer where they list names)."""
    plain: list[str] = []
    for roll, pairs in _rolled_up(path):
        if roll is not None and roll.names is not None:
            if name in roll.names:
                return True
            continue
        for file, shard in pairs():
            if shard is not None and shard.names is not None:
                if name in shard.names:
                    return True
            elif _uri.is_remote(file) or os.path.exists(file):
                plain.append(file)
    for _, batch in iter_batches(plain, [S.NAME]) if plain else ():
        if pc.any(pc.fill_null(pc.equal(batch.column(0), name), False)).as_py():
            return True
    return False


def iter_batches(
    path: TracePaths,
    columns: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    trace_ids: Iterable[str] | None = None,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Yield ``(file, batch)`` for every readable batch under ``path``.

    Only ``columns`` are decompressed (all when None); columns a file lacks come back as nulls. With ``steps``
    or ``trace_ids``, batches an index says hold none of them are skipped; the rest still need filtering.
    """
    wanted = list(S.SPAN_COLUMNS if columns is None else columns)
    unknown = [c for c in wanted if c not in S.SPAN_COLUMNS]
    if unknown:
        raise ValueError(f"unknown column(s) {', '.join(unknown)}; columns are {', '.join(S.SPAN_COLUMNS)}")
    step_set = None if steps is None else set(steps)
    trace_set = None if trace_ids is None else pa.array(list(trace_ids), pa.string())
    for files, index in _snapshots(path, lock=True):
        for file in files:
            entry = index["files"].get(os.path.basename(file), {})
            shard = _shard_index(file, index)
            chosen, size = _chosen(shard, entry, step_set, trace_set)
            if chosen == [] and shard is not None:
                continue  # its index says no batch holds what is asked: the file is not opened
            batches = read_batches(
                file,
                wanted,
                chosen,
                expect_size=size if chosen is not None else None,
                trust_footer=shard is not None and chosen is not None,
            )
            for batch in batches:
                yield file, batch
            message = batches.result.describe()
            if message:
                warnings.warn(message, TraceFileWarning, stacklevel=2)


def _as_set(value: Any) -> list[Any] | None:
    return None if value is None else [value] if isinstance(value, (str, bytes, int)) else list(value)


def read_spans(
    path: TracePaths,
    columns: Iterable[str] | None = None,
    steps: int | Iterable[int] | None = None,
    validate: bool | None = None,
    trace_ids: str | Iterable[str] | None = None,
) -> pa.Table:
    """The spans under ``path`` with ``columns`` (default all) of :data:`tracer.schema.SPAN_SCHEMA`.

    Only those columns and the filters' are decompressed. ``steps``, ``trace_ids``: keep these;
    ``validate``: keep only validation (True) or training (False) spans.
    """
    out_cols = list(S.SPAN_COLUMNS if columns is None else columns)
    step_set = _as_set(steps)
    trace_set = _as_set(trace_ids)
    read_cols = list(out_cols)
    for needed, active in ((S.STEP, step_set), (S.VALIDATE, validate), (S.TRACE_ID, trace_set)):
        if active is not None and needed not in read_cols:
            read_cols.append(needed)
    if S.INPUTS in read_cols:  # multi-turn prompt_ids are rebuilt from earlier spans (storage/history.py)
        read_cols += [c for c in HISTORY_COLUMNS if c not in read_cols]
    sets = ((S.STEP, step_set, pa.int64()), (S.TRACE_ID, trace_set, pa.string()))
    kept = [(column, pa.array(values, typ)) for column, values, typ in sets if values is not None]
    pieces: list[pa.RecordBatch] = []
    for _, batch in iter_batches(path, read_cols, steps=step_set, trace_ids=trace_set):
        masks = [pc.is_in(batch.column(column), value_set=values) for column, values in kept]
        if validate is not None:
            masks.append(pc.equal(pc.fill_null(batch.column(S.VALIDATE), False), validate))
        if masks:
            batch = batch.filter(pc.fill_null(functools.reduce(pc.and_, masks), False))
        if batch.num_rows:
            pieces.append(batch.select(read_cols))
    schema = pa.schema([S.SPAN_SCHEMA.field(c) for c in read_cols])
    return expand_history(pa.Table.from_batches(pieces, schema=schema)).select(out_cols)


def dataset(path: TracePaths) -> pds.Dataset:
    """The spans of a run as a :class:`pyarrow.dataset.Dataset` (DuckDB, Polars): the rows of :func:`read_spans`.

    pyarrow reads closed files in today's schema lazily; the others (open, older, damaged) are read here with the
    same warnings (FileNotFoundError: no such path)."""
    import pyarrow.dataset as pds  # heavy (BENCHMARKS.md, `import tracer`): loaded by the first dataset() call

    direct: list[str] = []
    others: list[str] = []
    for files, index in _snapshots(path, lock=True):
        for file in files:
            remote = _uri.is_remote(file)
            if not remote and os.path.basename(file) not in index["files"]:
                seal_if_abandoned(file, on_sealed=write_index)
            (direct if not remote and _opens_directly(file) else others).append(file)
    parts: list[pds.Dataset] = []
    if direct:
        parts.append(pds.dataset(direct, format="ipc", schema=S.SPAN_SCHEMA))
    if others or not parts:
        pieces = [batch for _, batch in iter_batches(others)] if others else []
        parts.append(pds.dataset(pa.Table.from_batches(pieces, schema=S.SPAN_SCHEMA)))
    return parts[0] if len(parts) == 1 else pds.dataset(parts)


def _opens_directly(file: str) -> bool:
    """A closed IPC file with a sound footer, every span column in its exact type: pyarrow may read it itself."""
    if not ends_closed(file):
        return False
    try:
        with pa.memory_map(file) as source:
            schema = pa.ipc.open_file(source).schema
    except (OSError, pa.ArrowException):
        return False
    return schema.names == S.SPAN_SCHEMA.names and schema.types == S.SPAN_SCHEMA.types


def parse_json(text: str | None) -> Any:
    """Parse one of the JSON columns (inputs, outputs, attributes, error); None stays None."""
    return None if text is None else json.loads(text)
