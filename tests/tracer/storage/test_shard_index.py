"""Shard indexes: written at close, read back, used by every reader, never trusted when they lie."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_fixtures import META, write_shard
from storage_fixtures import copy_run, temporaries

import tracer
from tracer import schema as S
from tracer.index import shard as _si
from tracer.index.closed import shard_closed
from tracer.index.readers import read_trajectories
from tracer.index.shard import INDEX_SUFFIX, ShardIndexBuilder, load_shard_index, shard_index_path
from tracer.read import read_steps
from tracer.storage.files import read_layout
from tracer.storage.seal import seal_if_abandoned
from tracer.storage.writer import SpanWriter
from tracer.summary import SUMMARY_SPAN_COLUMNS, step_partials, summarize

pytestmark = pytest.mark.usefixtures("shard_indexes_alone")  # the indexes' own answers, not the rollup's

GOLDEN_V1 = os.path.join(os.path.dirname(__file__), "..", "..", "..", "sample_data", "golden", "trace_v1.arrow")


def _span(trace: str, n: int, *, step: int | None, parent: bool, kind: str = S.KIND_LLM) -> dict[str, Any]:
    row = {
        S.TRACE_ID: trace,
        S.SPAN_ID: f"{trace}-{n}",
        S.PARENT_SPAN_ID: f"{trace}-0" if parent else None,
        S.NAME: "generate" if parent else "agent_loop",
        S.KIND: kind if parent else S.KIND_ROLLOUT,
        S.START_NS: 1_000 + n,
        S.END_NS: 2_000 + n,
        S.STATUS: S.STATUS_OK,
        S.STEP: step,
        S.SAMPLE_INDEX: str(n % 2),
        S.ROLLOUT_N: 0,
        S.VALIDATE: False,
    }
    return row


def _reward(trace: str, n: int, step: int | None, reward: float, end: int) -> dict[str, Any]:
    """A log_reward row (by trace id, or by key when ``trace`` is empty)."""
    row = _span(trace, n, step=step, parent=True, kind=S.KIND_REWARD)
    row.update({S.NAME: S.REWARD_SPAN_NAME, S.REWARD: reward, S.END_NS: end, S.ATTRIBUTES: f'{{"n": {n}}}'})
    return row


def _without_indexes(run: str) -> str:
    """A copy of ``run`` with every shard index left out: what readers see when there is none."""
    copy = tempfile.mkdtemp(prefix="rt-noindex-")
    shutil.rmtree(copy)
    copy_run(run, copy, indexes=False)
    return copy


def _same_everywhere(run: str, trace_ids: list[str], steps: list[int]) -> None:
    """Every reader path returns the same rows with the indexes and without."""
    bare = _without_indexes(run)
    try:
        assert read_trajectories(run).equals(read_trajectories(bare))
        for step in steps:
            assert read_trajectories(run, steps=[step]).equals(read_trajectories(bare, steps=[step]))
            assert read_trajectories(run, steps=[step], validate=False).equals(
                read_trajectories(bare, steps=[step], validate=False)
            )
            assert tracer.read_spans(run, steps=step).equals(tracer.read_spans(bare, steps=step))
        for tid in trace_ids:
            assert tracer.read_spans(run, trace_ids=[tid]).equals(tracer.read_spans(bare, trace_ids=[tid]))
        assert tracer.read_spans(run, trace_ids=[]).num_rows == 0
        assert read_steps(run) == read_steps(bare)
    finally:
        shutil.rmtree(bare, ignore_errors=True)


def test_index_written_at_close_and_read_back(tmp_path: Any) -> None:
    """A closed shard's index lists each batch's rows and steps and holds summarize's rows for its spans."""
    run = os.fspath(tmp_path)
    batches = [
        [_span("a", 0, step=1, parent=False), _span("a", 1, step=1, parent=True)],
        [_span("b", 0, step=2, parent=False), _reward("", 9, 2, 0.5, 5_000)],
    ]
    shard = write_shard(run, batches)
    assert os.path.exists(shard_index_path(shard))
    index = load_shard_index(shard)
    assert index is not None
    assert index.batch_rows == [2, 2]
    assert index.batch_steps == [[1], [2]]
    assert index.batches_of_traces(pa.array(["a"])) == [0]
    assert index.batches_of_traces(pa.array(["b", "nope"])) == [1]
    table = index.table()
    assert table is not None
    stored = table.filter(pa.compute.fill_null(pa.compute.not_equal(table.column(S.TRACE_ID), ""), False))
    spans = tracer.read_spans(shard, columns=SUMMARY_SPAN_COLUMNS)
    by_id = [(S.TRACE_ID, "ascending")]  # the index keeps its rows in hash-bucket order
    assert stored.select(list(S.TRAJECTORY_COLUMNS)).sort_by(by_id).equals(summarize(spans).sort_by(by_id))


def test_readers_open_only_the_batches_they_need(tmp_path: Any) -> None:
    """With an index, one trajectory reads only its batches and the trajectory list reads no span at all.

    The batches it should not read are damaged on disk (size and footer kept): reading them would warn.
    """
    run = os.fspath(tmp_path)
    shard = write_shard(
        run,
        [
            [_span("a", 0, step=1, parent=False), _span("a", 1, step=1, parent=True)],
            [_span("b", 0, step=2, parent=False), _span("b", 1, step=2, parent=True)],
            [_span("c", 0, step=3, parent=False)],
        ],
    )
    before = read_trajectories(run)
    a_spans = tracer.read_spans(run, trace_ids=["a"])
    layout = read_layout(shard)
    with open(shard, "r+b") as f:
        for offset, meta_len, body_len in layout.batches[1:]:
            f.seek(offset + meta_len + body_len // 2)
            f.write(b"\xa5" * (body_len // 4))
    assert load_shard_index(shard) is not None
    assert tracer.read_spans(run, trace_ids=["a"]).equals(a_spans)
    assert tracer.read_spans(run, steps=[1]).num_rows == 2
    assert read_trajectories(run).equals(before)
    assert read_steps(run) == ([1, 2, 3], 5)
    with pytest.warns(tracer.TraceFileWarning, match="damaged"):
        tracer.read_spans(run)


def test_open_shard_has_no_index_and_reads_the_same(tmp_path: Any) -> None:
    """A shard still being written has no index; readers read its spans."""
    run = os.fspath(tmp_path)
    writer = SpanWriter(run, META, on_close=shard_closed)
    writer.write(pa.RecordBatch.from_pylist([_span("a", 0, step=0, parent=False)], schema=S.SPAN_SCHEMA))
    assert writer.path is not None and load_shard_index(writer.path) is None
    assert read_trajectories(run).num_rows == 1
    writer.close()
    assert load_shard_index(writer.path) is not None


def _lie_stale(shard: str) -> None:
    with open(shard, "ab") as f:  # the shard changed after its index was written
        f.write(b"\0" * 8)


def _lie_truncated(shard: str) -> None:
    side = shard_index_path(shard)
    size = os.path.getsize(side)
    with open(side, "r+b") as f:
        f.truncate(size // 2)


def _lie_version(shard: str) -> None:
    side = shard_index_path(shard)
    with pa.OSFile(side) as src:
        reader = pa.ipc.open_file(src)
        table = reader.read_all()
    meta = dict(table.schema.metadata or {})
    meta[S.META_INDEX_VERSION.encode()] = b"999"
    with pa.OSFile(side, "wb") as sink, pa.ipc.new_file(sink, table.schema.with_metadata(meta)) as w:
        w.write_table(table)


def _lie_other_shard(shard: str) -> None:
    """The index of another shard (its batches, its trajectories) under this shard's name."""
    other = os.path.join(os.path.dirname(shard), "other")
    os.makedirs(other)
    fake = write_shard(other, [[_span("zzz", 0, step=1, parent=False)], [_span("zzz", 1, step=1, parent=True)]])
    shutil.copyfile(shard_index_path(fake), shard_index_path(shard))
    shutil.rmtree(other)


def _lie_batches(shard: str) -> None:
    """Same metadata, but the rows point at batches the shard does not have."""
    side = shard_index_path(shard)
    with pa.OSFile(side) as src:
        table = pa.ipc.open_file(src).read_all()
    wrong = pa.array([[7]] * table.num_rows, pa.list_(pa.int32()))
    table = table.set_column(table.schema.get_field_index(S.INDEX_BATCHES), S.INDEX_BATCHES, wrong)
    with pa.OSFile(side, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)


@pytest.mark.parametrize("lie", [_lie_stale, _lie_truncated, _lie_version, _lie_other_shard, _lie_batches])
def test_an_index_that_lies_is_ignored(tmp_path: Any, lie: Any) -> None:
    """A stale, truncated, foreign or inconsistent index is not used: readers read the spans."""
    run = os.path.join(os.fspath(tmp_path), "run")
    os.makedirs(run)
    shard = write_shard(
        run,
        [
            [_span("a", 0, step=1, parent=False), _span("a", 1, step=1, parent=True)],
            [_span("b", 0, step=2, parent=False), _reward("a", 5, 1, 1.0, 9_000)],
        ],
    )
    before = read_trajectories(run)
    lie(shard)
    if lie is not _lie_batches:
        assert load_shard_index(shard) is None
    else:
        index = load_shard_index(shard)
        assert index is None or index.table() is None
    with pytest.warns(tracer.TraceFileWarning) if lie is _lie_stale else contextlib.nullcontext():
        after = read_trajectories(run)
    assert after.equals(before)
    with _quiet():
        _same_everywhere(run, ["a", "b"], [1, 2])


def test_v1_golden_file_beside_indexed_shards(tmp_path: Any) -> None:
    """A version-1 file (no index) and indexed shards read the same as without indexes."""
    run = os.fspath(tmp_path)
    shutil.copyfile(GOLDEN_V1, os.path.join(run, "golden_v1.arrow"))
    write_shard(run, [[_span("a", 0, step=0, parent=False)], [_span("a", 1, step=0, parent=True)]])
    tids = [t for t in tracer.read_spans(run, columns=[S.TRACE_ID]).column(0).to_pylist()[:3]]
    _same_everywhere(run, [*tids, "a"], [0, 1])


# -- every reader, random runs --------------------------------------------------------------

_traj = st.fixed_dictionaries(
    {
        "spans": st.integers(1, 4),
        "step": st.sampled_from([0, 1, None]),
        "files": st.lists(st.integers(0, 2), min_size=1, max_size=3),  # where its spans go
        "mixed_step": st.booleans(),  # one span of another step
        "reward": st.sampled_from(["none", "by_id", "by_id_elsewhere", "by_key", "by_key_elsewhere"]),
        "root": st.booleans(),
    }
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trajs=st.lists(_traj, min_size=1, max_size=6),
    batch=st.integers(1, 4),
    killed=st.sampled_from([None, 0, 1, 2]),
    torn=st.sampled_from([None, 0, 1, 2]),
    step=st.sampled_from([0, 1, 2]),
    pick=st.integers(0, 5),
)
def test_every_reader_same_with_and_without_index(
    trajs: list[dict[str, Any]], batch: int, killed: int | None, torn: int | None, step: int, pick: int
) -> None:
    """Random runs (trajectories across batches and files, rewards by id or key elsewhere, killed writers, torn tails)."""
    rows: dict[int, list[dict[str, Any]]] = {0: [], 1: [], 2: []}
    for t, spec in enumerate(trajs):
        tid = f"{t:032x}"
        for n in range(spec["spans"]):
            where = spec["files"][n % len(spec["files"])]
            at = 2 if spec["mixed_step"] and n == spec["spans"] - 1 else spec["step"]
            rows[where].append(_span(tid, n, step=at, parent=n > 0 or not spec["root"]))
        home = spec["files"][0]
        reward = spec["reward"]
        if reward != "none":
            where = (home + 1) % 3 if reward.endswith("elsewhere") else home
            by_id = reward.startswith("by_id")
            rows[where].append(_reward(tid if by_id else "", 50 + t, spec["step"], float(t), 3_000 + t % 2))
    root = tempfile.mkdtemp(prefix="rt-index-")
    run = os.path.join(root, "run")
    try:
        for w in range(3):
            if not rows[w]:
                continue
            chunks = [rows[w][i : i + batch] for i in range(0, len(rows[w]), batch)]
            shard = write_shard(os.path.join(run, f"w{w}") if w == 2 else run, chunks, close=w != killed)
            if w == torn and w != killed:
                with open(shard, "r+b") as f:
                    f.truncate(os.path.getsize(shard) - 3)
        with _quiet():
            _same_everywhere(run, [f"{pick % len(trajs):032x}"], [step])
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Torn files warn on every read; the warnings are not what these tests check."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tracer.TraceFileWarning)
        yield


def test_a_failing_index_never_fails_the_writer(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A summary that raises, or an ``on_close`` that raises, leaves the shard without an index; every
    batch is still written and read."""

    def broken(spans: pa.Table) -> pa.Table:
        raise RuntimeError("summary broke")

    def on_close(path: str) -> None:
        raise RuntimeError("on_close broke")

    monkeypatch.setattr(
        _si, "builder", lambda bounded=True: ShardIndexBuilder(SUMMARY_SPAN_COLUMNS, broken, step_partials, bounded)
    )
    for n, writer in enumerate(
        [
            SpanWriter(os.fspath(tmp_path / "a"), META, on_close=shard_closed),
            SpanWriter(os.fspath(tmp_path / "b"), META, on_close=on_close),
        ]
    ):
        run = writer.run_dir
        writer.write(pa.RecordBatch.from_pylist([_span("a", n, step=0, parent=False)], schema=S.SPAN_SCHEMA))
        writer.close()
        assert writer.path is not None
        assert not os.path.exists(shard_index_path(writer.path))
        assert not temporaries(run)
        assert read_trajectories(run).column(S.TRACE_ID).to_pylist() == ["a"]


def test_a_closed_file_that_changes_is_looked_at_again(tmp_path: Any) -> None:
    """Sealing remembers a closed file only while its size and mtime stay: a torn copy in its place is seen."""
    run = os.fspath(tmp_path)
    shard = write_shard(run, [[_span("a", 0, step=0, parent=False)], [_span("a", 1, step=0, parent=True)]])
    assert seal_if_abandoned(shard).action == "closed"
    assert seal_if_abandoned(shard).action == "closed"
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 3)
    assert seal_if_abandoned(shard).action != "closed"
