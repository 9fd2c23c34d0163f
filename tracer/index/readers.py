"""Index-aware readers: the model's tables (:func:`tracer.summary.summarize`, :func:`tracer.summary.step_partials`)
read from shard indexes and the rollup wherever the stored rows are exact, from spans elsewhere."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S
from tracer.index import rollup
from tracer.index import shard as _shard_index
from tracer.index.shard import write_index
from tracer.read import TracePaths, indexed_files, read_spans, run_rollup
from tracer.summary.metrics import (  # the model's merge, shared so stored and computed aggregates agree
    _PART_LISTS,
    _keys,
    _merge_parts,
    _partials_part,
    _rows_part,
    step_partials,
)
from tracer.summary.rows import SUMMARY_SPAN_COLUMNS, _in_order, _key, summarize


def read_trajectories(
    path: TracePaths, steps: int | Iterable[int] | None = None, validate: bool | None = None
) -> pa.Table:
    """One row per trajectory under ``path`` (:data:`tracer.schema.TRAJECTORY_SCHEMA`, as :mod:`tracer.summary`
    defines it): :func:`summarize` of the files' spans. Indexed shards give their stored rows; a trajectory they
    cannot answer alone (spans in several files, a keyed reward elsewhere, mixed steps or splits under a filter) is
    summarised from its batches."""
    step_set = None if steps is None else [steps] if isinstance(steps, int) else list(steps)
    try:
        return _from_indexes(path, step_set, validate)
    except FileNotFoundError:
        # A file of the snapshot went away meanwhile (a compaction replaced it): read the run afresh.
        return summarize(read_spans(path, columns=SUMMARY_SPAN_COLUMNS, steps=step_set, validate=validate))


def _from_indexes(path: TracePaths, steps: list[int] | None, validate: bool | None) -> pa.Table:
    """:func:`read_trajectories` over stored summary rows where they are exact, spans elsewhere."""
    files = indexed_files(path, on_sealed=_sealed)
    stored = [None if shard is None else shard.table() for _, shard in files]
    tables = [(n, table) for n, table in enumerate(stored) if table is not None]
    plain = [n for n, table in enumerate(stored) if table is None]
    cols = list(SUMMARY_SPAN_COLUMNS)
    if not tables:
        return summarize(read_spans([f for f, _ in files], columns=cols, steps=steps, validate=validate))
    plain_ids: list[pa.Array] = [pa.array([], pa.string())]
    plain_spans = {n: read_spans(files[n][0], columns=cols, steps=steps, validate=validate) for n in plain}
    # Every trajectory row of every index, and the (step, sample, rollout, validate) keys of spans without a trace id.
    rows, keys = [], []
    for n, table in tables:
        tid = table.column(S.TRACE_ID)
        extra = tid.null_count > 0 or pc.any(pc.equal(tid, "")).as_py()  # rows of spans without a trace id
        own = table.filter(pc.fill_null(pc.not_equal(tid, ""), False)) if extra else table
        rows.append(own.append_column("_file", pa.array(np.full(own.num_rows, n, dtype=np.int64))))
        keyed = table.filter(pc.is_null(tid)) if extra else table.slice(0, 0)
        keys.append(pa.table({"_key": _key(keyed), "_file": pa.array([n] * keyed.num_rows, pa.int64())}))
    for n, spans in plain_spans.items():
        keyed = spans.filter(pc.fill_null(pc.equal(spans.column(S.TRACE_ID), ""), True))
        keys.append(pa.table({"_key": _key(keyed), "_file": pa.array([n] * keyed.num_rows, pa.int64())}))
        plain_ids.append(spans.column(S.TRACE_ID).combine_chunks())
    indexed = pa.concat_tables(rows)
    tid = indexed.column(S.TRACE_ID).combine_chunks()  # one array to hash (the other columns stay as read)
    # Which indexed trajectories the stored rows cannot answer alone: first, a trace id in several files.
    if len(pc.unique(tid)) == len(tid):
        redo = pa.array(np.zeros(len(tid), dtype=bool))
    else:
        counts = indexed.group_by(S.TRACE_ID, use_threads=False).aggregate([("_file", "count")])
        shared = counts.filter(pc.greater(counts.column("_file_count"), 1)).column(S.TRACE_ID)
        redo = pc.is_in(tid, value_set=shared.combine_chunks())
    in_plain = pa.concat_arrays(plain_ids)
    redo = pc.or_(redo, pc.is_in(tid, value_set=in_plain))
    all_keys = pa.concat_tables(keys)
    if all_keys.num_rows:
        by_key = all_keys.group_by("_key", use_threads=False).aggregate([("_file", "min"), ("_file", "max")])
        at = pc.index_in(_key(indexed), value_set=by_key.column("_key").combine_chunks())
        lo = pc.take(by_key.column("_file_min").combine_chunks(), at)
        hi = pc.take(by_key.column("_file_max").combine_chunks(), at)
        file_no = indexed.column("_file")
        elsewhere = pc.or_(pc.not_equal(lo, file_no), pc.not_equal(hi, file_no))
        redo = pc.or_(redo, pc.fill_null(elsewhere, False))
    if steps is not None or validate is not None:
        redo = pc.or_(redo, pc.invert(pc.fill_null(indexed.column(S.INDEX_UNIFORM), False)))
    redo = pc.fill_null(redo, True)
    keep = indexed.filter(pc.invert(redo)) if pc.any(redo).as_py() else indexed
    if steps is not None:
        keep = keep.filter(pc.fill_null(pc.is_in(keep.column(S.STEP), value_set=pa.array(steps, pa.int64())), False))
    if validate is not None:
        keep = keep.filter(pc.equal(pc.fill_null(keep.column(S.VALIDATE), False), validate))
    parts = [keep.select(list(S.TRAJECTORY_COLUMNS))]
    again = pc.unique(pc.filter(tid, redo))
    if plain or len(again):
        wanted = [*again.to_pylist(), ""]
        pieces = [
            plain_spans[n]
            if n in plain_spans
            else read_spans(f, columns=cols, steps=steps, validate=validate, trace_ids=wanted)
            for n, (f, _) in enumerate(files)
        ]
        parts.append(summarize(pa.concat_tables(pieces)))
    return _in_order(pa.concat_tables(parts))


def read_step_partials(path: TracePaths, value_metrics: bool = False) -> pa.Table:
    """``step_partials(read_trajectories(path))``: from a covering rollup (with ``value_metrics``, also its
    :data:`tracer.schema.VALUE_METRICS` columns), else from each index's stored aggregates where nothing outside its
    file can change them (no keyed reward for its steps elsewhere, no trace id shared with another file: ranges,
    then hashes, then ids), else from the files' trajectory rows."""
    roll = run_rollup(path)
    got = None if roll is None else roll.table()
    if got is not None:  # one file holds every file's aggregates, merged (tracer.storage.rollup)
        return got if value_metrics else got.select(S.STEP_PARTIALS_SCHEMA.names)
    try:
        return _partials_from_indexes(path)
    except FileNotFoundError:
        # A file of the snapshot went away meanwhile (a compaction replaced it): read the run afresh.
        return step_partials(read_trajectories(path))


def _partials_from_indexes(path: TracePaths) -> pa.Table:
    files = indexed_files(path, on_sealed=_sealed)
    stored: dict[int, _shard_index.StoredPartials] = {}
    read: dict[int, dict[str, _shard_index.Fixed] | None] = {}  # the value columns (and hashes) of each stored file
    ids: dict[int, pa.Array] = {}  # the trace ids of a file read whole
    ranges: list[tuple[str, str, int]] = []
    keyed_steps: set[int | None] = set()
    rest: set[int] = set()  # files read with read_trajectories
    for n, (file, shard) in enumerate(files):
        got, cols = _shard_index.landing_sources(shard, _shard_index.SORTED_COLUMNS) if shard else (None, None)
        if got is None:
            rest.add(n)
            spans = read_spans(file, columns=[S.TRACE_ID, S.STEP])
            tid = spans.column(S.TRACE_ID)
            keyed = pc.fill_null(pc.equal(tid, ""), True)
            if pc.any(keyed).as_py():
                keyed_steps.update(pc.unique(pc.filter(spans.column(S.STEP), keyed)).to_pylist())
            ids[n] = pc.unique(pc.filter(tid, pc.invert(keyed)).combine_chunks())
            if len(ids[n]):
                least, greatest = pc.min_max(ids[n]).values()
                ranges.append((least.as_py(), greatest.as_py(), n))
            continue
        if any(len(pc.list_flatten(got.partials.column(c))) for c in _PART_LISTS):
            return step_partials(read_trajectories([f for f, _ in files]))  # not what indexes store: trust none
        stored[n], read[n] = got, cols
        if got.value_counts is None:  # not what a writer writes: its values are read from its rows
            rest.add(n)
        if got.trace_range is not None:
            ranges.append((*got.trace_range, n))
        if got.keyed_steps is not None:  # rewards logged by key may join trajectories of any file
            rest.add(n)
            keyed_steps.update(got.keyed_steps)
    # Files that may share trace ids are those whose ranges overlap (or that say no range): compared by hash.
    unranged = [n for n, got in stored.items() if got.trace_range is None and got.partials.num_rows]
    suspects = sorted(set(_overlapping(ranges)) | set(unranged) | ({r[2] for r in ranges} if unranged else set()))
    if len(suspects) > 1:
        shared = _sharing(files, suspects, stored, ids)
        if shared is None:  # an index unreadable now: nothing can be said about what it shares
            return step_partials(read_trajectories([f for f, _ in files]))
        rest.update(shared)
    if keyed_steps:
        for n, got in stored.items():
            if n not in rest and keyed_steps.intersection(got.partials.column(S.STEP).to_pylist()):
                rest.add(n)
    kept = [n for n in stored if n not in rest]
    if any(read[n] is None for n in kept):  # unreadable now: read the run's rows
        return step_partials(read_trajectories([f for f, _ in files]))
    parts = []
    if kept:  # one table and one array of each kind, so the cost is per row, not per file
        counts = pa.concat_tables([stored[n].partials for n in kept])
        values = _presorted([stored[n] for n in kept], [read[n] for n in kept])  # type: ignore[misc]
        if values is None:  # values not what the aggregates count: read the run's rows
            return step_partials(read_trajectories([f for f, _ in files]))
        if not rest:
            ordered = _in_key_order(counts, values)
            if ordered is not None:  # no group in two files (one compacted file, or steps apart): merged already
                return ordered
        part = _partials_part(counts)
        part.values = tuple((v, np.repeat(np.arange(counts.num_rows), n)) for v, n in values)
        parts.append(part)
    if rest:
        parts.append(_rows_part(read_trajectories([files[n][0] for n in sorted(rest)]), counts=True, values=True))
    return _merge_parts(parts)


def _presorted(
    got: Sequence[_shard_index.StoredPartials], read: Sequence[Mapping[str, _shard_index.Fixed]]
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None:
    """The sorted values of some shard indexes' stored aggregates (:data:`tracer.index.shard.SORTED_COLUMNS`):
    per value column, the values and how many belong to each aggregate row (rows of all the files in turn);
    None when an index's disagree."""
    out = []
    for k, name in enumerate(_shard_index.SORTED_COLUMNS):
        chunks, counts = [], []
        for stored, cols in zip(got, read, strict=True):
            if stored.value_counts is None:
                return None
            values, valid = cols[name]
            n = int(stored.value_counts[k].sum())
            if valid is None:
                if len(values) != n:
                    return None
            elif not (valid[:n].all() and not valid[n:].any()):  # n values, then nulls only
                return None
            chunks.append(values[:n])
            counts.append(stored.value_counts[k])
        # Every file's values, in file order (one copy, whatever the number of files).
        flat = chunks[0] if len(chunks) == 1 else np.concatenate(chunks) if chunks else np.zeros(0)
        out.append((np.asarray(flat, dtype=np.float64), np.concatenate(counts)))
    return out[0], out[1]


def _in_key_order(
    counts: pa.Table, values: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
) -> pa.Table | None:
    """Stored aggregates (rows of one file or several) with their sorted values, in :func:`merge_step_partials`'
    order; None when a (step, validate) group is in more than one row (then they merge)."""
    step, null, validate = _keys(counts)
    order = np.lexsort((validate, step, null))  # by step (nulls last), then validate
    same = (step[order][1:] == step[order][:-1]) & (null[order][1:] == null[order][:-1])
    if (same & (validate[order][1:] == validate[order][:-1])).any():
        return None
    if max(len(flat) for flat, _ in values) >= 2**31:  # past a list array's 32-bit offsets: the merge's layout
        return None
    table = counts
    for c, (flat, n) in zip(_PART_LISTS, values, strict=True):
        offsets = np.zeros(len(n) + 1, dtype=np.int32)
        np.cumsum(n, out=offsets[1:])
        at = table.schema.get_field_index(c)
        lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.float64()))
        table = table.set_column(at, table.schema.field(at), lists)
    if (np.diff(order) != 1).any():
        table = table.take(pa.array(order, pa.int64()))
    return table.combine_chunks()


def _sharing(
    files: Sequence[tuple[str, _shard_index.ShardIndex | None]],
    suspects: list[int],
    stored: Mapping[int, _shard_index.StoredPartials],
    ids: Mapping[int, pa.Array],
) -> set[int] | None:
    """The files among ``suspects`` holding a trace id another of them holds; None when an index cannot say. Compared on
    the indexes' trace id hashes first (:data:`tracer.schema.INDEX_TRACE_HASH`); the ids themselves are read and
    compared only for hashes found in more than one file."""
    hashes: dict[int, np.ndarray] = {}
    valid: dict[int, np.ndarray | None] = {}  # rows of an index with a hash (None: all)
    for n in suspects:
        if n in ids:
            own = np.asarray(_shard_index.trace_hashes(ids[n]).to_numpy(zero_copy_only=False), dtype=np.uint64)
        else:
            cols = _shard_index.landing_sources(files[n][1], [S.INDEX_TRACE_HASH], False)[1]  # type: ignore[arg-type]
            if cols is None:
                return None
            values, valid[n] = cols[S.INDEX_TRACE_HASH]
            own = values if valid[n] is None else values[valid[n]]
            if (pc.sum(stored[n].partials.column(S.PART_TRAJECTORIES)).as_py() or 0) != len(own):
                return None  # not what its aggregates count
        hashes[n] = np.asarray(own, dtype=np.uint64)
    ordered = np.sort(np.concatenate(list(hashes.values())))
    twice = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(twice):
        return set()
    # A hash in two rows: compare the trace ids of those rows (a collision of different ids shares nothing).
    hit_ids, hit_files = [], []
    for n, h in hashes.items():
        rows = np.flatnonzero(np.isin(h, twice))
        if not len(rows):
            continue
        if n in ids:
            own_ids = ids[n]
        else:
            keys = _shard_index.step_sources(files[n][1], [S.TRACE_ID])[1]  # type: ignore[arg-type]
            if keys is None:
                return None
            tid = keys.column(S.TRACE_ID).combine_chunks()
            mask = valid[n]
            own_ids = tid if mask is None else tid.filter(pa.array(mask, pa.bool_()))
        hit_ids.append(own_ids.take(pa.array(rows)))
        hit_files.append(pa.array(np.full(len(rows), n, dtype=np.int64)))
    hits = pa.table({S.TRACE_ID: pa.concat_arrays(hit_ids), "_file": pa.concat_arrays(hit_files)})
    counts = hits.group_by(S.TRACE_ID, use_threads=False).aggregate([("_file", "count_distinct")])
    many = counts.filter(pc.greater(counts.column("_file_count_distinct"), 1)).column(S.TRACE_ID).combine_chunks()
    return set(pc.unique(hits.filter(pc.is_in(hits.column(S.TRACE_ID), value_set=many)).column("_file")).to_pylist())


def _overlapping(ranges: list[tuple[str, str, int]]) -> list[int]:
    """The files among ``(least, greatest, file)`` whose trace id range overlaps another's."""
    ranges = sorted(ranges)
    out = []
    reach: str | None = None  # the greatest end among the ranges before
    for i, (lo, hi, n) in enumerate(ranges):
        before = reach is not None and lo <= reach
        after = i + 1 < len(ranges) and ranges[i + 1][0] <= hi
        if before or after:
            out.append(n)
        reach = hi if reach is None or hi > reach else reach
    return out


def _sealed(shard: str) -> None:
    """A shard this read sealed (its writer is gone): its index, and the run's rollup on the rollup thread."""
    if write_index(shard):
        rollup.update_later(os.path.dirname(shard) or ".", read_step_partials)
