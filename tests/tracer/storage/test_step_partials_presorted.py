"""Per-step aggregates from the sorted values stored in shard indexes (sidecar version 3): a compacted
run answers without a merge, and every run still gives exactly the aggregates of its trajectory rows."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_fixtures import equal_metrics as _equal_metrics
from index_fixtures import partial_reward as _reward
from index_fixtures import partial_span as _span
from index_fixtures import quiet_warnings as _quiet
from index_fixtures import write_shard
from storage_fixtures import copy_run

import tracer
import tracer.index.readers
import tracer.summary
from tracer import schema as S
from tracer.index.readers import read_step_partials, read_trajectories
from tracer.index.shard import INDEX_SUFFIX, load_shard_index, shard_index_path, step_sources
from tracer.storage.compact import compact
from tracer.summary import partial_metrics, step_metrics, step_partials

pytestmark = pytest.mark.usefixtures("shard_indexes_alone")  # the indexes' own answers, not the rollup's


def _refuse(*_: Any, **__: Any) -> None:
    raise AssertionError("not the stored path")


_traj = st.fixed_dictionaries(
    {
        "spans": st.integers(1, 3),
        "step": st.sampled_from([0, 1, 2, 5, None]),
        "validate": st.booleans(),
        "files": st.lists(st.integers(0, 2), min_size=1, max_size=2),  # where its spans go
        "reward": st.sampled_from(["none", "by_id", "by_id_elsewhere", "by_key", "by_key_elsewhere"]),
        "value": st.sampled_from([0.0, -0.0, 0.5, -1.0, 3.0, float("inf")]),
    }
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trajs=st.lists(_traj, min_size=1, max_size=10),
    killed=st.sampled_from([None, 2]),
    target=st.sampled_from([1, 3000, 1 << 26]),
)
def test_a_compacted_run_gives_its_trajectory_rows_aggregates(
    trajs: list[dict[str, Any]], killed: int | None, target: int
) -> None:
    """Compacted into one file or several (steps spread over them), rewards logged late, a killed writer."""
    rows: dict[int, list[dict[str, Any]]] = {w: [] for w in range(3)}
    for t, spec in enumerate(trajs):
        tid = f"{spec['files'][0]}{t:031x}"
        for n in range(spec["spans"]):
            rows[spec["files"][n % len(spec["files"])]].append(_span(tid, n, spec["step"], spec["validate"]))
        if spec["reward"] != "none":
            home = spec["files"][0]
            where = (home + 1) % 3 if spec["reward"].endswith("elsewhere") else home
            by_id = spec["reward"].startswith("by_id")
            rows[where].append(_reward(tid if by_id else "", 50 + t, spec["step"], spec["value"], spec["validate"]))
    root = tempfile.mkdtemp(prefix="rt-presorted-")
    run = os.path.join(root, "run")
    try:
        for w, own in rows.items():
            if own:
                write_shard(run, [own[i : i + 2] for i in range(0, len(own), 2)], close=w != killed)
        with _quiet():
            truth = step_partials(read_trajectories(run))
            assert read_step_partials(run).equals(truth)
            compact(run, target_bytes=target)
            assert step_partials(read_trajectories(run)).equals(truth)
            got = read_step_partials(run)
            assert got.equals(truth)
            _equal_metrics(partial_metrics(got), step_metrics(read_trajectories(run)))
            bare = os.path.join(root, "bare")
            copy_run(run, bare, indexes=False)
            assert read_step_partials(bare).equals(truth)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _clean_run(run: str, steps: list[list[int]]) -> None:
    """One closed shard per entry of ``steps``, its trajectories at those steps (rewards by id)."""
    for w, own in enumerate(steps):
        spans = []
        for t, step in enumerate(own):
            tid = f"w{w}t{t:03d}"
            spans += [_span(tid, 0, step, t % 3 == 0), _span(tid, 1, step, t % 3 == 0)]
            spans.append(_reward(tid, 2, step, (t * 7 % 5) / 4, t % 3 == 0))
        write_shard(run, [spans])


def test_one_compacted_file_answers_without_a_merge(tmp_path: Any, monkeypatch: Any) -> None:
    """A run compacted into one file: its stored aggregates and sorted values, no rows read, nothing sorted."""
    run = os.fspath(tmp_path)
    _clean_run(run, [[0, 1, 1, 2], [1, 2, 2, 3], [0, 3, 3, 3]])
    truth = step_partials(read_trajectories(run))
    compact(run)
    assert len(tracer.list_trace_files(run)) == 1
    monkeypatch.setattr(tracer.index.readers, "read_trajectories", _refuse)
    monkeypatch.setattr(tracer.index.readers, "_merge_parts", _refuse)
    assert read_step_partials(run).equals(truth)


def test_shards_whose_steps_do_not_meet_answer_without_a_merge(tmp_path: Any, monkeypatch: Any) -> None:
    """Files whose (step, validate) groups are disjoint: their rows put in order; where groups meet, merged."""
    run = os.fspath(tmp_path)
    _clean_run(run, [[4, 4, 5], [0, 1, 1], [2, 3]])
    truth = step_partials(read_trajectories(run))
    with monkeypatch.context() as m:
        m.setattr(tracer.index.readers, "_merge_parts", _refuse)
        assert read_step_partials(run).equals(truth)
    _clean_run(run, [[1, 6]])  # step 1 now in two files
    truth = step_partials(read_trajectories(run))
    assert read_step_partials(run).equals(truth)


def _rewrite(shard: str, edit: Any) -> None:
    """Rewrite the shard's sidecar with ``edit(table, metadata)`` applied (everything else kept)."""
    side = shard_index_path(shard)
    with pa.OSFile(side) as f:
        table = pa.ipc.open_file(f).read_all()
    table, meta = edit(table, dict(table.schema.metadata or {}))
    with pa.OSFile(side, "wb") as f, pa.ipc.new_file(f, table.schema.with_metadata(meta)) as w:
        for b in table.to_batches():
            w.write_batch(b)


def test_sidecars_of_an_older_version_are_ignored(tmp_path: Any) -> None:
    """A version-2 sidecar (no sorted values) is not an index: the shard's spans are read instead."""
    run = os.fspath(tmp_path)
    _clean_run(run, [[0, 1], [1, 2]])
    shard = tracer.list_trace_files(run)[0]
    truth = step_partials(read_trajectories(run))

    def older(table: pa.Table, meta: dict[bytes, bytes]) -> tuple[pa.Table, dict[bytes, bytes]]:
        keep = [n for n in table.schema.names if n not in (S.INDEX_SORTED_REWARDS, S.INDEX_SORTED_LATENCIES)]
        return table.select(keep), meta | {S.META_INDEX_VERSION.encode(): b"2"}

    _rewrite(shard, older)
    assert load_shard_index(shard) is None
    assert read_step_partials(run).equals(truth)


def test_sorted_values_that_do_not_fit_their_counts_are_not_used(tmp_path: Any) -> None:
    """Sorted columns holding fewer values than the stored counts say: the file's rows are read instead."""
    run = os.fspath(tmp_path)
    _clean_run(run, [[0, 1, 1], [2, 2]])
    shard = tracer.list_trace_files(run)[0]
    truth = step_partials(read_trajectories(run))

    def fewer(table: pa.Table, meta: dict[bytes, bytes]) -> tuple[pa.Table, dict[bytes, bytes]]:
        at = table.schema.get_field_index(S.INDEX_SORTED_REWARDS)
        return table.set_column(at, table.schema.field(at), pa.nulls(table.num_rows, pa.float64())), meta

    _rewrite(shard, fewer)
    index = load_shard_index(shard)
    assert index is not None and step_sources(index, [S.INDEX_SORTED_REWARDS])[1] is not None
    assert read_step_partials(run).equals(truth)


_values = st.lists(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e308, -1e308, 5e-324]),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(groups=st.lists(_values, min_size=1, max_size=6))
def test_moments_are_numpys_to_the_bit(groups: list[list[float]]) -> None:
    """Mean, std, min and max of each sorted run: the bits of np.mean, np.std, np.min and np.max."""
    runs = [np.sort(np.array(g, dtype=np.float64)) for g in groups]
    at = np.zeros(len(runs) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in runs], out=at[1:])
    with np.errstate(all="ignore"):
        got = tracer.summary.metrics._moments(np.concatenate(runs), at)
        for i, r in enumerate(runs):
            want = [np.mean(r), np.std(r), np.min(r), np.max(r)] if len(r) else [math.nan] * 4
            for k, w in enumerate(want):
                assert np.array_equal(np.float64(got[k][i]), np.float64(w), equal_nan=True)
                assert math.isnan(w) or math.copysign(1.0, got[k][i]) == math.copysign(1.0, float(w))
