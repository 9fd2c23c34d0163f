"""The run overview's reads of shard indexes (sidecar columns as numpy, stored sorted values merged): the same
values and the same aggregates, bit for bit, as the pyarrow reads and the trajectory rows, for uncompacted,
compacted and index-less runs, with live and killed writers."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_fixtures import META, random_trajectory, write_random_run, write_shard
from index_fixtures import bits as _bits
from index_fixtures import equal_metrics as _equal_metrics
from index_fixtures import equal_tables as _equal_tables
from index_fixtures import partial_reward as _reward
from index_fixtures import partial_span as _span
from index_fixtures import quiet_warnings as _quiet
from storage_fixtures import copy_run

import tracer
import tracer.index.readers
import tracer.summary
from tracer import schema as S
from tracer.index import shard as _si
from tracer.index.closed import shard_closed
from tracer.index.readers import read_step_partials, read_trajectories
from tracer.index.shard import INDEX_SUFFIX, load_shard_index, shard_index_path, step_sources
from tracer.storage.compact import compact
from tracer.storage.writer import SpanWriter
from tracer.summary import partial_metrics, step_partials

pytestmark = pytest.mark.usefixtures("shard_indexes_alone")  # the indexes' own answers, not the rollup's

_FIXED = sorted(_si.FIXED_COLUMNS, key=_si.INDEX_SCHEMA.get_field_index)  # step_sources wants schema order


def _same_fixed(got: dict[str, Any], table: pa.Table) -> None:
    """``landing_sources``' columns hold what pyarrow reads of the sidecar: the same validity, the same bits."""
    for c in _FIXED:
        values, valid = got[c]
        col = table.column(c).combine_chunks()
        want_valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        assert np.array_equal(want_valid, np.ones(len(col), bool) if valid is None else valid), c
        want = np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False)) if col.null_count else col.to_numpy()
        assert len(values) == len(col)
        assert np.array_equal(_bits(values)[want_valid], _bits(np.asarray(want))[want_valid]), c


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    trajs=st.lists(random_trajectory, min_size=1, max_size=14),
    killed=st.sampled_from([None, 1]),
    prefix=st.booleans(),
)
def test_the_fast_reads_give_the_aggregates_of_the_trajectory_rows(
    tmp_path_factory: Any, trajs: list[dict[str, Any]], killed: int | None, prefix: bool
) -> None:
    """Uncompacted (groups split over files), compacted, without indexes: one table."""
    root = os.fspath(tmp_path_factory.mktemp("landing"))
    run = os.path.join(root, "run")
    write_random_run(run, trajs, set() if killed is None else {killed}, prefix)
    with _quiet():
        truth = step_partials(read_trajectories(run))
        got = read_step_partials(run)
        _equal_tables(got, truth)
        _equal_metrics(partial_metrics(got), partial_metrics(truth))
        for file, index in tracer.read.indexed_files(run):
            if index is not None:
                side = step_sources(index, _FIXED)[1]
                fast = _si.landing_sources(index, _FIXED)[1]
                assert side is not None and fast is not None, file
                _same_fixed(fast, side)
        bare = os.path.join(root, "bare")
        copy_run(run, bare, indexes=False)
        _equal_tables(read_step_partials(bare), truth)
        compact(run)
        _equal_tables(step_partials(read_trajectories(run)), truth)
        _equal_tables(read_step_partials(run), truth)
    shutil.rmtree(root, ignore_errors=True)


def _clean_run(run: str, steps: list[list[int]], rewards: list[float | None]) -> list[str]:
    """One closed shard per entry of ``steps``, its trajectories at those steps (rewards by id, in turn)."""
    shards = []
    k = 0
    for w, own in enumerate(steps):
        spans = []
        for t, step in enumerate(own):
            tid = f"w{w}t{t:03d}"
            spans += [_span(tid, 0, step, t % 3 == 0), _span(tid, 1, step, t % 3 == 0)]
            spans.append(_reward(tid, 2, step, rewards[k % len(rewards)], t % 3 == 0))
            k += 1
        shards.append(write_shard(run, [spans[i : i + 4] for i in range(0, len(spans), 4)]))
    return shards


def test_groups_split_over_files_merge_without_reading_rows(tmp_path: Any, monkeypatch: Any) -> None:
    """Every step in every shard: the stored runs merge without reading a row, to the rows' bits."""
    run = os.fspath(tmp_path)
    rewards = [0.25, -0.0, 0.0, float("nan"), None, 1.0, -1.0, float("inf")]
    _clean_run(run, [[0, 1, 1, 2, 5], [1, 2, 2, 0], [0, 5, 2, 1, 1, 1]], rewards)
    truth = step_partials(read_trajectories(run))
    monkeypatch.setattr(
        tracer.index.readers, "read_trajectories", lambda *_: (_ for _ in ()).throw(AssertionError("rows"))
    )
    _equal_tables(read_step_partials(run), truth)


def test_a_sidecar_not_laid_out_as_written_is_read_through_pyarrow(tmp_path: Any) -> None:
    """A sidecar rewritten compressed (still a valid index): the values are the same."""
    run = os.fspath(tmp_path)
    shards = _clean_run(run, [[0, 1, 1], [1, 2]], [0.5, None, 2.0])
    truth = step_partials(read_trajectories(run))
    side = shard_index_path(shards[0])
    with pa.OSFile(side) as f:
        table = pa.ipc.open_file(f).read_all()
    batches = table.to_batches()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.OSFile(side, "wb") as f, pa.ipc.new_file(f, table.schema, options=options) as w:
        for b in batches:
            w.write_batch(b)
    index = load_shard_index(shards[0])
    assert index is not None
    fast = _si.landing_sources(index, _FIXED)[1]
    plain = step_sources(index, _FIXED)[1]
    assert fast is not None and plain is not None
    _same_fixed(fast, plain)
    _equal_tables(read_step_partials(run), truth)


def test_a_torn_sidecar_is_not_an_index(tmp_path: Any) -> None:
    """A sidecar cut short: not an index (the shard's rows are read)."""
    run = os.fspath(tmp_path)
    shards = _clean_run(run, [[0, 1, 1], [1, 2]], [0.5, 1.5])
    truth = step_partials(read_trajectories(run))
    side = shard_index_path(shards[1])
    with open(side, "rb") as f:
        data = f.read()
    for cut in (len(data) - 3, len(data) // 2, 40):
        with open(side, "wb") as f:
            f.write(data[:cut])
        assert load_shard_index(shards[1]) is None
        _equal_tables(read_step_partials(run), truth)


def test_an_open_shard_is_read_with_the_indexed_ones(tmp_path: Any) -> None:
    """A writer still writing (its lock held, no footer, no index) beside closed shards: its rows count too."""
    run = os.fspath(tmp_path)
    _clean_run(run, [[0, 1, 1], [1, 2, 2]], [0.5, -0.0, None])
    live = SpanWriter(run, META, on_close=shard_closed)
    try:
        rows = [_span("live0", 0, 1, False), _span("live0", 1, 1, False), _reward("live0", 2, 1, 4.0, False)]
        live.write(pa.RecordBatch.from_pylist(rows, schema=S.SPAN_SCHEMA))
        assert live.path is not None and load_shard_index(live.path) is None
        with _quiet():
            truth = step_partials(read_trajectories(run))
            assert pc.sum(truth.column(S.PART_TRAJECTORIES)).as_py() == 7
            _equal_tables(read_step_partials(run), truth)
    finally:
        live.close()
    _equal_tables(read_step_partials(run), step_partials(read_trajectories(run)))
