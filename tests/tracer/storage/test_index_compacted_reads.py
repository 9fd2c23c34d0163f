"""Readers use a compacted file's own index when it agrees with the file, and read the file when it does not.

Compaction writes an index for each output (``_<name>.index``, :mod:`tracer.index.shard`);
``tracer.read`` checks it as it checks a shard's (size, footer digest, name, version). Every read of a
compacted run, its index valid, missing, torn or made stale by a rewrite of the file, returns what the
same run returns read without any index.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
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
from index_fixtures import bare_copy, write_shard

import tracer
from tracer import schema as S
from tracer.index.readers import read_step_partials, read_trajectories
from tracer.index.shard import INDEX_SUFFIX, load_shard_index, shard_index_path
from tracer.read import has_spans_named, indexed_files, read_steps
from tracer.storage.compact import compact
from tracer.storage.files import read_layout
from tracer.storage.index import load_index
from tracer.storage.seal import seal_if_abandoned
from tracer.storage.writer import SpanWriter
from tracer.summary import step_metrics

pytestmark = pytest.mark.usefixtures("shard_indexes_alone")  # the indexes' own answers, not the rollup's

META = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION}


def _span(trace: str, n: int, step: int | None, validate: bool, reward: float | None = None) -> dict[str, Any]:
    """Span ``n`` of ``trace`` (0 is its root); with ``reward``, a log_reward row (by key when ``trace`` is "")."""
    row = {
        S.TRACE_ID: trace,
        S.SPAN_ID: f"{trace or 'key'}-{n}",
        S.PARENT_SPAN_ID: None if n == 0 else f"{trace}-0",
        S.NAME: "agent_loop" if n == 0 else "generate",
        S.KIND: S.KIND_ROLLOUT if n == 0 else S.KIND_LLM,
        S.START_NS: 1_000 + 7 * n,
        S.END_NS: 2_000 + 11 * n,
        S.STATUS: S.STATUS_OK,
        S.STEP: step,
        S.SAMPLE_INDEX: trace or str(n),
        S.ROLLOUT_N: 0,
        S.VALIDATE: validate,
    }
    if reward is not None:
        row.update({S.KIND: S.KIND_REWARD, S.NAME: S.REWARD_SPAN_NAME, S.REWARD: reward, S.END_NS: 3_000 + n})
    return row


def _outputs(run: str) -> list[str]:
    return [os.path.join(run, n) for n in sorted(load_index(run)["files"])]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tracer.TraceFileWarning)
        yield


# -- what can happen to a compacted file's index ----------------------------------------------


def _deleted(out: str) -> None:
    os.remove(shard_index_path(out))


def _torn(out: str) -> None:
    with open(shard_index_path(out), "r+b") as f:
        f.truncate(os.path.getsize(shard_index_path(out)) // 2)


def _stale(out: str) -> None:
    """The file rewritten under its name (same rows, one per batch) after its index was written."""
    with pa.OSFile(out) as source:
        table = pa.ipc.open_file(source).read_all()
    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", 3))
    with pa.OSFile(out + ".new", "wb") as sink, pa.ipc.new_file(sink, table.schema, options=options) as w:
        w.write_table(table, max_chunksize=1)
    os.replace(out + ".new", out)


_HARM = {"kept": None, "deleted": _deleted, "torn": _torn, "stale": _stale}


def _harm(out: str, how: str) -> None:
    before = pathlib.Path(out).read_bytes()
    harm = _HARM[how]
    if harm is not None:
        harm(out)
    if how == "kept":
        assert load_shard_index(out) is not None
    elif how != "stale" or pathlib.Path(out).read_bytes() != before:  # a rewrite to the same bytes leaves it valid
        assert load_shard_index(out) is None


def _same_metrics(a: dict[Any, dict[str, float]], b: dict[Any, dict[str, float]]) -> None:
    assert list(a) == list(b)
    for key in a:
        assert a[key].keys() == b[key].keys()
        for m, v in a[key].items():
            assert (math.isnan(v) and math.isnan(b[key][m])) or v == b[key][m], (key, m, v, b[key][m])


def _same_reads(run: str, bare: str, trace_ids: list[str], steps: list[int | None]) -> None:
    """Every reader of ``run`` (compacted, indexed) returns what it returns of ``bare`` (no index)."""

    def spans(path: str, **kw: Any) -> pa.Table:
        return tracer.read_spans(path, **kw).sort_by(S.SPAN_ID).combine_chunks()

    def trajectories(path: str, **kw: Any) -> pa.Table:
        return read_trajectories(path, **kw).sort_by(S.TRACE_ID).combine_chunks()

    for tid in trace_ids:
        assert spans(run, trace_ids=[tid]).equals(spans(bare, trace_ids=[tid]))
    assert spans(run, trace_ids=trace_ids).equals(spans(bare, trace_ids=trace_ids))
    for step in steps:
        if step is not None:
            assert spans(run, steps=step).equals(spans(bare, steps=step))
            assert spans(run, steps=[step], trace_ids=trace_ids).equals(spans(bare, steps=[step], trace_ids=trace_ids))
            assert trajectories(run, steps=[step]).equals(trajectories(bare, steps=[step]))
    assert spans(run).equals(spans(bare))
    assert read_steps(run) == read_steps(bare)
    for name in ("agent_loop", "generate", S.REWARD_SPAN_NAME, "absent"):
        assert has_spans_named(run, name) == has_spans_named(bare, name)
    whole = trajectories(run)
    assert whole.equals(trajectories(bare))
    # The landing page's aggregates (tracer.summary, from the indexes' stored partials) and the exporters'.
    assert read_step_partials(run).equals(read_step_partials(bare))
    _same_metrics(step_metrics(whole), step_metrics(trajectories(bare)))


# -- random runs --------------------------------------------------------------------------------

_traj = st.fixed_dictionaries(
    {
        "spans": st.integers(1, 4),
        "step": st.sampled_from([0, 1, 2, None]),
        "validate": st.booleans(),
        "workers": st.lists(st.integers(0, 2), min_size=1, max_size=2),  # where its spans go
        "reward": st.sampled_from(["none", "by_id", "by_id_elsewhere", "by_key", "by_key_elsewhere"]),
    }
)


# too_slow: every example writes shards, copies, compacts and reads the run some forty times.
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trajs=st.lists(_traj, min_size=1, max_size=6),
    batch=st.integers(1, 3),
    killed=st.sampled_from([None, 0, 2]),
    target=st.sampled_from([1, 2048, 1 << 30]),  # one output per input, a few, one
    harms=st.lists(st.sampled_from(sorted(_HARM)), min_size=3, max_size=3),
    pick=st.integers(0, 5),
)
def test_compacted_runs_read_the_same_whatever_became_of_their_indexes(
    trajs: list[dict[str, Any]], batch: int, killed: int | None, target: int, harms: list[str], pick: int
) -> None:
    """Several writers (one killed), trajectories split across them, rewards by id or key, in one file or another."""
    rows: dict[int, list[dict[str, Any]]] = {w: [] for w in range(3)}
    for t, spec in enumerate(trajs):
        tid = f"t{t}"
        for n in range(spec["spans"]):
            rows[spec["workers"][n % len(spec["workers"])]].append(_span(tid, n, spec["step"], spec["validate"]))
        if spec["reward"] != "none":
            home = spec["workers"][0]
            where = (home + 1) % 3 if spec["reward"].endswith("elsewhere") else home
            key = tid if spec["reward"].startswith("by_id") else ""
            rows[where].append(_span(key, 50 + t, spec["step"], spec["validate"], reward=t / 3))
    root = tempfile.mkdtemp(prefix="rt-compacted-index-")
    run = os.path.join(root, "run")
    try:
        for w, spans in rows.items():
            if spans:
                write_shard(run, [spans[i : i + batch] for i in range(0, len(spans), batch)], close=w != killed)
        bare = bare_copy(run, os.path.join(root, "bare"))
        with _quiet():
            compact(run, target_bytes=target)
            outputs = _outputs(run)
            assert outputs
            for n, out in enumerate(outputs):
                _harm(out, harms[n % len(harms)])
            tids = [f"t{pick % len(trajs)}", "nowhere"]
            _same_reads(run, bare, tids, [0, 1, 2, None])
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- the index is what answers ------------------------------------------------------------------


def _damage_batches(file: str, keep: set[int]) -> None:
    """Overwrite the middle of every record batch not in ``keep`` (size and footer stay): reading one warns."""
    layout = read_layout(file)
    with open(file, "r+b") as f:
        for i, (offset, meta_len, body_len) in enumerate(layout.batches):
            if i not in keep:
                f.seek(offset + meta_len + body_len // 2)
                f.write(b"\xa5" * max(1, body_len // 4))


def test_a_compacted_files_index_answers_without_reading_other_batches(tmp_path: Any) -> None:
    """Trajectory ``a`` is alone in step 1: with every other batch of the compacted file damaged, its reads,
    the run's steps and its span names come back without a warning, so those batches were never decoded."""
    run = os.fspath(tmp_path / "run")
    write_shard(run, [[_span("a", 0, 1, False), _span("a", 1, 1, False)], [_span("b", 0, 2, False)]], close=False)
    write_shard(run, [[_span("c", 0, 3, False), _span("c", 1, 3, False)], [_span("", 9, 2, False, reward=1.0)]])
    compact(run)
    (out,) = _outputs(run)
    ((file, index),) = indexed_files(run)
    assert file == out and index is not None  # before: None for every compacted file
    assert index.batch_steps == [[1], [2], [3]]
    holding = index.batches_of_traces(pa.array(["a"]))
    assert holding == [0]
    want = tracer.read_spans(run, trace_ids=["a"])
    assert sorted(want.column(S.SPAN_ID).to_pylist()) == ["a-0", "a-1"]
    steps, names = read_steps(run), has_spans_named(run, S.REWARD_SPAN_NAME)
    _damage_batches(out, keep=set(holding))
    assert load_shard_index(out) is not None  # same size, same footer: still its index
    with warnings.catch_warnings():
        warnings.simplefilter("error", tracer.TraceFileWarning)
        assert tracer.read_spans(run, trace_ids=["a"]).equals(want)
        assert tracer.read_spans(run, steps=[1], trace_ids=["a"]).equals(want)
        assert tracer.read_spans(run, trace_ids=["nowhere"]).num_rows == 0  # no batch is read at all
        assert read_steps(run) == steps == ([1, 2, 3], 6)
        assert has_spans_named(run, S.REWARD_SPAN_NAME) is names is True
    # Without its index the file is read, and the damage shows.
    os.remove(shard_index_path(out))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tracer.TraceFileWarning)
        tracer.read_spans(run, trace_ids=["a"])
    assert any(issubclass(w.category, tracer.TraceFileWarning) for w in caught)


def test_a_compacted_file_without_a_valid_index_still_reads_a_step_from_the_compaction_entry(tmp_path: Any) -> None:
    """The ``_index.json`` entry (batch steps for the file's size) still narrows a step read when the index is gone."""
    run = os.fspath(tmp_path / "run")
    write_shard(run, [[_span("a", 0, 1, False)], [_span("b", 0, 2, False)], [_span("c", 0, 3, False)]])
    compact(run)
    (out,) = _outputs(run)
    want = tracer.read_spans(run, steps=[2])
    _torn(out)
    assert load_shard_index(out) is None
    _damage_batches(out, keep={1})
    with warnings.catch_warnings():
        warnings.simplefilter("error", tracer.TraceFileWarning)
        assert tracer.read_spans(run, steps=[2]).equals(want)
