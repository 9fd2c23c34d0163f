"""Per-step aggregates computed on numpy arrays: the same numbers as a plain-Python reference,
and files compared by trace id hashes that collide still merge to the run's aggregates."""

from __future__ import annotations

import math
import os
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from index_fixtures import trace_span, trajectory_table, write_shard

import tracer.index.readers
import tracer.summary
from tracer import schema as S
from tracer.index.readers import read_step_partials, read_trajectories
from tracer.index.shard import load_shard_index, shard_index_path, step_sources, trace_hashes
from tracer.summary import merge_step_partials, step_partials

pytestmark = pytest.mark.usefixtures("shard_indexes_alone")  # the indexes' own answers, not the rollup's

_SUMS = (S.PART_TRAJECTORIES, S.NUM_SPANS, S.NUM_LLM_CALLS, S.NUM_TOOL_CALLS, S.NUM_TOOL_ERRORS, S.PART_NOT_OK)

_row = st.fixed_dictionaries(
    {
        # Steps far apart too (2**40).
        "step": st.sampled_from([0, 1, 7, -3, None, 2**40]),
        "validate": st.sampled_from([False, True, None]),
        "reward": st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([0.0, -0.0, 1.0])),
        "start": st.one_of(st.none(), st.integers(0, 10**9)),
        "length": st.one_of(st.none(), st.integers(0, 10**12)),
        "status": st.sampled_from([S.STATUS_OK, S.STATUS_ERROR, None]),
        "counts": st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 9), st.integers(0, 9)),
    }
)


def _reference(t: pa.Table) -> list[dict[str, Any]]:
    """The aggregates row by row in Python: one row per (step, validate), by step (nulls last) then validate."""
    groups: dict[tuple[Any, bool], dict[str, Any]] = {}
    for r in t.to_pylist():
        key = (r[S.STEP], bool(r[S.VALIDATE]))
        g = groups.setdefault(key, {c: 0 for c in _SUMS} | {S.PART_REWARDS: [], S.PART_LATENCIES: []})
        g[S.PART_TRAJECTORIES] += 1
        for c in (S.NUM_SPANS, S.NUM_LLM_CALLS, S.NUM_TOOL_CALLS, S.NUM_TOOL_ERRORS):
            g[c] += r[c]
        g[S.PART_NOT_OK] += r[S.STATUS] != S.STATUS_OK
        if r[S.REWARD] is not None:
            g[S.PART_REWARDS].append(r[S.REWARD])
        if r[S.START_NS] is not None and r[S.END_NS] is not None:
            g[S.PART_LATENCIES].append(float(r[S.END_NS] - r[S.START_NS]) / 1e9)
    out = []
    for (step, val), g in sorted(groups.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])):
        out.append({S.STEP: step, S.VALIDATE: val, **g})
        for c in (S.PART_REWARDS, S.PART_LATENCIES):
            g[c].sort()
    return out


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(_row, max_size=40), cut=st.integers(0, 40))
def test_aggregates_are_the_plain_python_ones(rows: list[dict[str, Any]], cut: int) -> None:
    """Counts summed, values sorted per group, exactly what a row-by-row loop gives; split in two or not."""
    t = trajectory_table(rows)
    want = _reference(t)
    for got in (step_partials(t), merge_step_partials([step_partials(t.slice(0, cut)), step_partials(t.slice(cut))])):
        rows_got = got.to_pylist()
        assert [(r[S.STEP], r[S.VALIDATE]) for r in rows_got] == [(r[S.STEP], r[S.VALIDATE]) for r in want]
        for a, b in zip(rows_got, want, strict=True):
            assert {c: a[c] for c in _SUMS} == {c: b[c] for c in _SUMS}
            for c in (S.PART_REWARDS, S.PART_LATENCIES):
                assert a[c] == b[c], c
                # -0.0 == 0.0: the sign of a zero may differ with the order of ties, nothing more.
                assert all(math.copysign(1, x) == math.copysign(1, y) or x == y == 0 for x, y in zip(a[c], b[c]))


def test_trace_hashes_are_stable_and_skip_missing_ids() -> None:
    got = trace_hashes(pa.array(["a", "", None, "a", "b"]))
    assert got.type == pa.uint64() and got.is_null().to_pylist() == [False, True, True, False, False]
    assert got[0] == got[3] and got[0] != got[4]
    assert trace_hashes(pa.array(["b"]))[0] == got[4]  # the same id, the same hash, in any call


def _rehash(shard: str, value: int) -> None:
    """Rewrite the shard's index with every trace id hash set to ``value`` (everything else kept)."""
    side = shard_index_path(shard)
    with pa.OSFile(side) as f:
        table = pa.ipc.open_file(f).read_all()
    at = table.schema.get_field_index(S.INDEX_TRACE_HASH)
    old = table.column(at).combine_chunks()
    forced = pa.array([None if v is None else value for v in old.to_pylist()], pa.uint64())
    table = table.set_column(at, table.schema.field(at), forced)
    with pa.OSFile(side, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table.combine_chunks())


def _run(tmp_path: Any, shared: bool) -> tuple[str, list[str]]:
    """Three closed shards with overlapping trace id ranges; with ``shared``, one trajectory in two of them."""
    run = os.fspath(tmp_path)
    shards = []
    for w in range(3):
        spans = [trace_span(f"t{t:03d}{w}", n, t % 3) for t in range(5) for n in range(2)]
        if shared and w == 1:
            spans.append(trace_span("t0000", 5, 0))  # a span of shard 0's first trajectory
        shards.append(write_shard(run, [spans]))
    return run, shards


@pytest.mark.parametrize("forced", [None, 0, 7])
@pytest.mark.parametrize("shared", [False, True])
def test_colliding_hashes_compare_the_trace_ids(
    tmp_path: Any, monkeypatch: Any, shared: bool, forced: int | None
) -> None:
    """Files whose ranges overlap are compared by hash; equal hashes of different ids share nothing."""
    run, shards = _run(tmp_path, shared)
    truth = step_partials(read_trajectories(run))
    if forced is not None:  # every id of every file has one hash: each is compared on its id
        for shard in shards:
            _rehash(shard, forced)
            index = load_shard_index(shard)
            assert index is not None and step_sources(index, [S.INDEX_TRACE_HASH])[1] is not None
    if not shared:  # nothing shared, collisions or not: the indexes answer alone

        def refuse(*_: Any, **__: Any) -> None:
            raise AssertionError("trajectory rows read")

        monkeypatch.setattr(tracer.index.readers, "read_trajectories", refuse)
    assert read_step_partials(run).equals(truth)
