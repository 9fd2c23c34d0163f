"""Per-step aggregates: stored in shard indexes, merged, and always what the trajectory rows give."""

from __future__ import annotations

import base64
import contextlib
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_fixtures import trajectory_table, write_shard
from storage_fixtures import copy_run

import tracer
import tracer.index.readers
import tracer.summary
from tracer import schema as S
from tracer.index.readers import read_step_partials, read_trajectories
from tracer.index.shard import INDEX_SUFFIX, load_shard_index, shard_index_path, stored_step_partials
from tracer.summary import (
    GROUP_METRICS,
    SUMMARY_SPAN_COLUMNS,
    merge_step_partials,
    partial_metrics,
    step_counts,
    step_metrics,
    step_partials,
    step_values,
    summarize,
)

pytestmark = pytest.mark.usefixtures("shard_indexes_alone")  # the indexes' own answers, not the rollup's


def _span(
    trace: str, n: int, *, step: int | None, parent: bool, validate: bool = False, **extra: Any
) -> dict[str, Any]:
    row = {
        S.TRACE_ID: trace,
        S.SPAN_ID: f"{trace}-{n}",
        S.PARENT_SPAN_ID: f"{trace}-0" if parent else None,
        S.NAME: "generate" if parent else "agent_loop",
        S.KIND: S.KIND_LLM if parent else S.KIND_ROLLOUT,
        S.START_NS: 1_000 + 7 * n,
        S.END_NS: 2_000 + 11 * n,
        S.STATUS: S.STATUS_OK,
        S.STEP: step,
        S.SAMPLE_INDEX: str(n % 2),
        S.ROLLOUT_N: 0,
        S.VALIDATE: validate,
    }
    row.update(extra)
    return row


def _reward(trace: str, n: int, step: int | None, reward: float, validate: bool) -> dict[str, Any]:
    """A log_reward row: by trace id, or by key when ``trace`` is empty."""
    return _span(
        trace,
        n,
        step=step,
        parent=True,
        validate=validate,
        **{S.KIND: S.KIND_REWARD, S.NAME: S.REWARD_SPAN_NAME, S.REWARD: reward, S.END_NS: 3_000 + n},
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tracer.TraceFileWarning)
        yield


def _same_metrics(a: dict[Any, dict[str, float]], b: dict[Any, dict[str, float]]) -> None:
    """The same metrics, but for those of whole groups (:data:`GROUP_METRICS`), which partials cannot give."""
    assert list(a) == list(b)
    for k in a:
        assert a[k].keys() - set(GROUP_METRICS) == b[k].keys() - set(GROUP_METRICS)
        for m, v in a[k].items():
            if m in GROUP_METRICS:
                continue
            w = b[k][m]
            assert (math.isnan(v) and math.isnan(w)) or v == w, (k, m, v, w)


# -- merging: any split of the rows gives the rows' aggregates ------------------------------

_row = st.fixed_dictionaries(
    {
        "step": st.sampled_from([0, 1, 7, None]),
        "validate": st.sampled_from([False, True, None]),
        "reward": st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)),
        "start": st.integers(0, 10**9),
        "length": st.one_of(st.none(), st.integers(0, 10**12)),
        "status": st.sampled_from([S.STATUS_OK, S.STATUS_ERROR, S.STATUS_INCOMPLETE, None]),
        "counts": st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 9), st.integers(0, 9)),
    }
)


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(_row, min_size=0, max_size=30), cuts=st.lists(st.integers(0, 30), max_size=4), seed=st.randoms())
def test_any_split_merges_to_the_aggregates_of_all_rows(rows: list[dict[str, Any]], cuts: list[int], seed: Any) -> None:
    """Rows cut into parts, shuffled, aggregated per part and merged: the aggregates (and metrics) of all rows."""
    table = trajectory_table(rows)
    order = list(range(table.num_rows))
    seed.shuffle(order)
    shuffled = table.take(pa.array(order, pa.int64()))
    bounds = sorted({0, table.num_rows, *(c for c in cuts if c < table.num_rows)})
    parts = [step_partials(shuffled.slice(a, b - a)) for a, b in zip(bounds, bounds[1:], strict=False)]
    seed.shuffle(parts)
    whole = step_partials(table)
    assert merge_step_partials(parts).equals(whole)
    _same_metrics(partial_metrics(merge_step_partials(parts)), step_metrics(table))
    if parts:  # parts not merged yet: partial_metrics merges them itself
        _same_metrics(partial_metrics(pa.concat_tables(parts)), step_metrics(table))
    assert pc.sum(whole.column(S.PART_TRAJECTORIES)).as_py() == (table.num_rows or None)
    # Counts and values apart (as a shard index and its own columns give them) merge to the same.
    assert merge_step_partials([step_counts(shuffled), step_values(shuffled)]).equals(whole)


def test_metrics_of_one_group_by_hand() -> None:
    """The numbers of one group: mean, population std, min, max, percentiles of the latencies, rates."""
    rows = [
        {"step": 3, "validate": None, "reward": r, "start": 0, "length": int(s * 1e9), "status": st_, "counts": c}
        for r, s, st_, c in [
            (1.0, 1.0, S.STATUS_OK, (4, 2, 2, 1)),
            (3.0, 2.0, S.STATUS_ERROR, (4, 1, 0, 0)),
            (None, 4.0, None, (2, 3, 2, 0)),
        ]
    ]
    metrics = step_metrics(trajectory_table(rows))
    assert list(metrics) == [(3, False)]
    m = metrics[(3, False)]
    assert m["trajectories"] == 3.0
    assert (m["reward/mean"], m["reward/std"], m["reward/min"], m["reward/max"]) == (2.0, 1.0, 1.0, 3.0)
    assert m["turns/mean"] == 2.0 and m["tool_calls/mean"] == 4 / 3 and m["tool_error_rate"] == 0.25
    assert m["errors"] == 2.0  # error and a null status
    assert m["latency_s/p50"] == 2.0 and m["latency_s/p95"] == pytest.approx(3.8)


# -- stored in the shard index, read back for a run ------------------------------------------


def test_a_shard_index_stores_the_aggregates_of_its_rows(tmp_path: Any) -> None:
    run = os.fspath(tmp_path)
    rows = [_span("a", 0, step=1, parent=False), _span("a", 1, step=1, parent=True), _reward("a", 2, 1, 0.5, False)]
    rows += [_span("b", 0, step=2, parent=False, validate=True)]
    shard = write_shard(run, [rows])
    index = load_shard_index(shard)
    assert index is not None
    got = stored_step_partials(index)
    assert got is not None
    assert got.trace_range == ("a", "b") and got.keyed_steps is None
    rows = summarize(tracer.read_spans(shard, columns=SUMMARY_SPAN_COLUMNS))
    assert got.partials.equals(step_counts(rows))  # the counts; the values are the index's own columns
    assert got.partials.column(S.STEP).to_pylist() == [1, 2]
    assert got.partials.column(S.PART_TRAJECTORIES).to_pylist() == [1, 1]
    assert step_partials(rows).column(S.PART_REWARDS).to_pylist() == [[0.5], []]


def test_clean_shards_answer_without_their_trajectory_rows(tmp_path: Any, monkeypatch: Any) -> None:
    """Closed shards that share nothing: the run's aggregates come from the indexes alone."""
    run = os.fspath(tmp_path)
    for w in range(3):
        write_shard(run, [[_span(f"w{w}t{t}", n, step=t % 2, parent=n > 0) for t in range(4) for n in range(3)]])
    truth = step_partials(read_trajectories(run))

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("trajectory rows read")

    monkeypatch.setattr(tracer.index.readers, "read_trajectories", refuse)
    assert read_step_partials(run).equals(truth)


def _lie(shard: str, partials: pa.Table) -> None:
    """Rewrite the shard's index with other aggregates (everything else kept)."""
    side = shard_index_path(shard)
    with pa.OSFile(side) as f:
        table = pa.ipc.open_file(f).read_all()
    meta = dict(table.schema.metadata or {})
    old = pa.ipc.open_stream(pa.py_buffer(base64.b64decode(meta[S.META_INDEX_STEPS.encode()]))).schema.metadata
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, partials.schema.with_metadata(old)) as w:
        w.write_table(partials)
    meta[S.META_INDEX_STEPS.encode()] = base64.b64encode(sink.getvalue().to_pybytes())
    with pa.OSFile(side, "wb") as f, pa.ipc.new_file(f, table.schema.with_metadata(meta)) as w:
        for b in table.to_batches():
            w.write_batch(b)


@pytest.mark.parametrize("broken", ["count", "values", "schema", "garbage"])
def test_aggregates_that_do_not_fit_their_index_are_not_used(tmp_path: Any, broken: str) -> None:
    """Undecodable aggregates are ignored; so are ones that miscount the rows, where the rows are read."""
    run = os.fspath(tmp_path)
    shard = write_shard(run, [[_span("a", 0, step=1, parent=False), _span("c", 0, step=1, parent=False)]])
    write_shard(run, [[_span("b", 0, step=2, parent=False)]])  # its trace id range lies in the first's: ids are read
    truth = step_partials(read_trajectories(run))
    if broken == "count":  # aggregates of one trajectory in an index of two
        _lie(shard, step_counts(read_trajectories(shard).slice(0, 1)))
    elif broken == "values":  # values stored in the aggregates, which indexes never do
        _lie(shard, step_partials(read_trajectories(shard)))
    elif broken == "schema":
        _lie(shard, pa.table({"x": [1]}))
    else:
        side = shard_index_path(shard)
        with pa.OSFile(side) as f:
            table = pa.ipc.open_file(f).read_all()
        meta = {**(table.schema.metadata or {}), S.META_INDEX_STEPS.encode(): b"not base64 at all!"}
        with pa.OSFile(side, "wb") as f, pa.ipc.new_file(f, table.schema.with_metadata(meta)) as w:
            for b in table.to_batches():
                w.write_batch(b)
    assert read_step_partials(run).equals(truth)


# -- random runs ------------------------------------------------------------------------------

_traj = st.fixed_dictionaries(
    {
        "spans": st.integers(1, 4),
        "step": st.sampled_from([0, 1, None]),
        "validate": st.booleans(),
        "files": st.lists(st.integers(0, 3), min_size=1, max_size=2),  # where its spans go
        "reward": st.sampled_from(["none", "none", "by_id", "by_id_elsewhere", "by_key", "by_key_elsewhere"]),
        "root": st.booleans(),
        "fails": st.booleans(),
    }
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trajs=st.lists(_traj, min_size=1, max_size=8),
    batch=st.integers(1, 4),
    killed=st.sampled_from([None, 0, 3]),
    unindexed=st.sampled_from([None, 1, 2]),
    prefixed=st.booleans(),
)
def test_a_runs_aggregates_are_its_trajectory_rows_aggregates(
    trajs: list[dict[str, Any]], batch: int, killed: int | None, unindexed: int | None, prefixed: bool
) -> None:
    """Several writers, steps and splits, rewards missing or logged late elsewhere, shards without an index.

    ``prefixed``: trace ids start with their first file's number, as the recorder's start with a
    process prefix, so files' trace id ranges overlap only where trajectories are shared.
    """
    rows: dict[int, list[dict[str, Any]]] = {w: [] for w in range(4)}
    for t, spec in enumerate(trajs):
        tid = f"{spec['files'][0]}{t:031x}" if prefixed else f"{t:032x}"
        status = S.STATUS_ERROR if spec["fails"] else S.STATUS_OK
        for n in range(spec["spans"]):
            where = spec["files"][n % len(spec["files"])]
            rows[where].append(
                _span(tid, n, step=spec["step"], parent=n > 0 or not spec["root"], validate=spec["validate"])
                | {S.STATUS: status}
            )
        home = spec["files"][0]
        if spec["reward"] != "none":
            where = (home + 1) % 4 if spec["reward"].endswith("elsewhere") else home
            by_id = spec["reward"].startswith("by_id")
            rows[where].append(_reward(tid if by_id else "", 50 + t, spec["step"], t / 3, spec["validate"]))
    root = tempfile.mkdtemp(prefix="rt-partials-")
    run = os.path.join(root, "run")
    try:
        for w in range(4):
            if rows[w]:
                chunks = [rows[w][i : i + batch] for i in range(0, len(rows[w]), batch)]
                shard = write_shard(os.path.join(run, f"w{w}") if w == 3 else run, chunks, close=w != killed)
                if w == unindexed and w != killed:
                    os.remove(shard_index_path(shard))
        with _quiet():
            trajectories = read_trajectories(run)
            got = read_step_partials(run)
            assert got.equals(step_partials(trajectories))
            _same_metrics(partial_metrics(got), step_metrics(trajectories))
            bare = os.path.join(root, "bare")
            copy_run(run, bare, indexes=False)
            assert read_step_partials(bare).equals(got)
    finally:
        shutil.rmtree(root, ignore_errors=True)
