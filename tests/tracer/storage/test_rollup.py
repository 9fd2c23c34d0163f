"""The run rollup (tracer.index.rollup): one file answering the run overview for every closed shard.

Whatever the run (trajectories split over shards, rewards logged by key, killed writers, compaction),
a reader gets the same steps, span count, span names and per-step aggregates with the rollup as
without it; a rollup that no longer covers the directory, or is damaged, is not used; updating it
never fails a writer.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import shutil
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_fixtures import META, equal_metrics, equal_tables, random_trajectory, write_random_run, write_shard
from index_fixtures import partial_reward as _reward
from index_fixtures import partial_span as _span
from index_fixtures import quiet_warnings as _quiet
from storage_fixtures import temporaries

import tracer
import tracer.summary
from tracer import schema as S
from tracer.index import rollup as R
from tracer.index.closed import shard_closed
from tracer.index.readers import read_step_partials, read_trajectories
from tracer.index.shard import shard_index_path
from tracer.read import has_spans_named, read_steps, run_rollup
from tracer.storage.compact import compact
from tracer.storage.writer import SpanWriter
from tracer.summary import partial_metrics, step_partials


def _answers(run: str) -> tuple[Any, ...]:
    """What the overview reads: steps and span rows, two name questions, the per-step aggregates."""
    return (
        read_steps(run),
        has_spans_named(run, "generate"),
        has_spans_named(run, "log_token_stats"),
        read_step_partials(run),
    )


def _without_rollup(run: str) -> tuple[Any, ...]:
    path = os.path.join(run, R.ROLLUP_NAME)
    aside = path + ".aside"
    had = os.path.exists(path)
    if had:
        os.rename(path, aside)
    try:
        assert run_rollup(run) is None
        return _answers(run)
    finally:
        if had:
            os.rename(aside, path)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    assert a[:3] == b[:3]
    equal_tables(a[3], b[3])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    trajs=st.lists(random_trajectory, min_size=1, max_size=12),
    killed=st.sets(st.integers(0, 3), max_size=2),
    prefix=st.booleans(),
    order=st.permutations(range(4)),
)
def test_the_rollup_answers_as_the_files_do(
    tmp_path_factory: Any, trajs: list[dict[str, Any]], killed: set[int], prefix: bool, order: list[int]
) -> None:
    """Every close updates it (merged or rebuilt); killed shards are sealed by the first read, which updates it
    too; then compaction: at each point the answers equal those without it, and the trajectory rows'."""
    run = os.path.join(os.fspath(tmp_path_factory.mktemp("rollup")), "run")
    write_random_run(run, trajs, killed, prefix, order)
    with _quiet():
        truth = step_partials(read_trajectories(run))  # seals the killed shards: the rollup takes them
        R.wait_idle()  # ... on the rollup thread, all of them in one or two updates
        assert run_rollup(run) is not None  # every file closed and indexed: covered
        got = _answers(run)
        equal_tables(got[3], truth)
        _same(got, _without_rollup(run))
        _same_metrics(run, truth)
        compact(run)
        assert run_rollup(run) is not None  # compaction updated it for its output
        after = _answers(run)
        _same(after, _without_rollup(run))
        equal_tables(after[3], truth)
        assert after[0] == got[0]
        _same_metrics(run, truth)


def _same_metrics(run: str, truth: pa.Table) -> None:
    """The rollup's stored value metrics give the step metrics computed from the values, bit for bit, for
    the whole table and for each split (the overview's filter)."""
    stored = read_step_partials(run, value_metrics=True)
    assert stored.schema.names == S.ROLLUP_SCHEMA.names
    equal_metrics(partial_metrics(stored), partial_metrics(truth))
    for split in (False, True):
        keep = pc.equal(stored.column(S.VALIDATE), split)
        equal_metrics(
            partial_metrics(stored.filter(keep)),
            partial_metrics(truth.filter(pc.equal(truth.column(S.VALIDATE), split))),
        )


def _clean_run(run: str, shards: int, step_of: Any = lambda w, t: t % 3) -> list[str]:
    """``shards`` closed shards of four trajectories each, trace ids a prefix per shard (no trajectory shared)."""
    out = []
    for w in range(shards):
        spans = []
        for t in range(4):
            tid = f"w{w}t{t}"
            step = step_of(w, t)
            spans += [_span(tid, 0, step, False), _span(tid, 1, step, False), _reward(tid, 2, step, 0.25 * t, False)]
        out.append(write_shard(run, [spans[i : i + 5] for i in range(0, len(spans), 5)]))
    return out


def test_files_that_share_no_trajectory_are_merged_in_and_others_rebuild_it(tmp_path: Any, monkeypatch: Any) -> None:
    """A closed shard whose trace ids are new merges into the rollup without reading the covered files; one
    holding a covered trajectory's span rebuilds it from every file, exactly."""
    run = os.fspath(tmp_path)
    _clean_run(run, 3)
    before = R.load_rollup(run)
    assert before is not None and len(before.files) == 3
    built: list[int] = []
    real = R._built
    monkeypatch.setattr(R, "_built", lambda files, of: built.append(len(files)) or real(files, of))
    _clean_run(run, 1, step_of=lambda w, t: 9)  # trace ids w0t*: taken by the first shard already
    assert built == [4]  # shares trajectories with a covered file: rebuilt
    _same(_answers(run), _without_rollup(run))
    equal_tables(read_step_partials(run), step_partials(read_trajectories(run)))
    spans = [_span("zz0", 0, 4, True), _span("zz0", 1, 4, True), _reward("zz0", 2, 4, 2.0, True)]
    write_shard(run, [spans])
    assert built == [4]  # a new trace id range: merged in
    got = R.load_rollup(run)
    assert got is not None and len(got.files) == 5
    _same(_answers(run), _without_rollup(run))
    equal_tables(read_step_partials(run), step_partials(read_trajectories(run)))


def _covered(run: str) -> bool:
    return run_rollup(run) is not None


def test_a_rollup_that_does_not_cover_the_directory_is_not_used(tmp_path: Any) -> None:
    """A file added (an open shard), one replaced by other spans under its name, one deleted: the rollup is
    passed over, and the answers are those of the files as they are."""
    run = os.path.join(os.fspath(tmp_path), "run")
    shards = _clean_run(run, 3)
    assert _covered(run)
    live = SpanWriter(run, META, on_close=shard_closed)
    try:
        live.write(pa.RecordBatch.from_pylist([_span("live", 0, 1, False)], schema=S.SPAN_SCHEMA))
        assert not _covered(run)  # the open shard is not covered
        with _quiet():
            _same(_answers(run), _without_rollup(run))
            assert pc.sum(read_step_partials(run).column(S.PART_TRAJECTORIES)).as_py() == 13
    finally:
        live.close()
    assert _covered(run)  # its close took it in
    # Another closed shard (other trajectories, steps and rewards) put in place of shards[1], with its index.
    other = os.path.join(os.fspath(tmp_path), "other")
    (elsewhere,) = _clean_run(other, 1, step_of=lambda w, t: 20 + t)
    for src, dst in ((elsewhere, shards[1]), (shard_index_path(elsewhere), shard_index_path(shards[1]))):
        shutil.copyfile(src, dst)
    with _quiet():
        assert not _covered(run)
        got = _answers(run)
        _same(got, _without_rollup(run))
        assert {20, 21, 22, 23} <= set(got[0][0])
        equal_tables(got[3], step_partials(read_trajectories(run)))
    os.remove(shards[0])
    os.remove(shard_index_path(shards[0]))
    assert not _covered(run)
    _same(_answers(run), _without_rollup(run))
    equal_tables(read_step_partials(run), step_partials(read_trajectories(run)))


@pytest.mark.parametrize(
    "damage",
    ["cut", "garbage", "empty", "version", "schema", "directory"],
)
def test_a_damaged_rollup_is_not_used_and_the_next_update_replaces_it(tmp_path: Any, damage: str) -> None:
    run = os.fspath(tmp_path)
    _clean_run(run, 3)
    truth = _without_rollup(run)
    path = os.path.join(run, R.ROLLUP_NAME)
    data = pathlib.Path(path).read_bytes()
    if damage == "directory":
        os.remove(path)
        os.mkdir(path)
    else:
        with open(path, "wb") as f:
            if damage == "cut":
                f.write(data[: len(data) // 2])
            elif damage == "garbage":
                f.write(b"ARROW1" + os.urandom(len(data)))
            elif damage in ("version", "schema"):
                table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
                meta = dict(table.schema.metadata)
                if damage == "version":
                    meta[R.META_ROLLUP.encode()] = meta[R.META_ROLLUP.encode()].replace(b'"version":1', b'"version":99')
                else:
                    table = table.drop_columns([S.PART_LATENCIES])
                with pa.ipc.new_file(f, table.schema.with_metadata(meta)) as w:
                    w.write_table(table)
    assert not _covered(run)
    _same(_answers(run), truth)
    if damage == "directory":
        shutil.rmtree(path)
    _clean_run(run, 1, step_of=lambda w, t: 11)  # a writer's close: rebuilt from every file
    assert _covered(run)
    equal_tables(read_step_partials(run), step_partials(read_trajectories(run)))


def test_a_rollup_that_cannot_be_written_never_fails_the_writer(tmp_path: Any) -> None:
    """The lock path taken by a directory: closes succeed, no rollup, every answer from the shards' indexes."""
    run = os.fspath(tmp_path)
    os.makedirs(os.path.join(run, R.LOCK_NAME))
    _clean_run(run, 2)
    assert not os.path.exists(os.path.join(run, R.ROLLUP_NAME))
    equal_tables(read_step_partials(run), step_partials(read_trajectories(run)))


def _close_shards(run: str, worker: int, shards: int) -> None:
    for s in range(shards):
        spans = []
        for t in range(3):
            tid = f"p{worker}s{s}t{t}"
            spans += [_span(tid, 0, t, False), _reward(tid, 1, t, float(worker + t), False)]
        write_shard(run, [spans])


def test_writers_closing_at_once_leave_one_rollup_of_every_file(tmp_path: Any) -> None:
    """Four processes closing five shards each at the same time: the lock serialises the updates, and the
    last one leaves a rollup that covers all twenty files and equals the rows'."""
    run = os.fspath(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_close_shards, args=(run, w, 5)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    R.update(
        run, read_step_partials
    )  # what a reader's seal or the next close would do, should an update have given up waiting
    roll = run_rollup(run)
    assert roll is not None and len(roll.files) == 20
    equal_tables(read_step_partials(run), step_partials(read_trajectories(run)))
    assert not temporaries(run)


def test_a_rotating_writer_updates_the_rollup_off_its_thread(tmp_path: Any) -> None:
    """Rotation hands the update to the rollup thread; the writer's final close covers every file."""
    run = os.fspath(tmp_path)
    writer = SpanWriter(run, META, max_file_bytes=1, on_close=shard_closed)  # a new file after every batch
    for t in range(5):
        rows = [_span(f"r{t}", 0, t, False), _reward(f"r{t}", 1, t, 1.0, False)]
        writer.write(pa.RecordBatch.from_pylist(rows, schema=S.SPAN_SCHEMA))
    writer.close()
    roll = run_rollup(run)
    assert roll is not None and len(roll.files) == len(tracer.list_trace_files(run)) == 5
    equal_tables(read_step_partials(run), step_partials(read_trajectories(run)))


@pytest.mark.parametrize("reward_first", [False, True])
def test_a_reward_logged_by_key_in_another_file_rebuilds_the_rollup(tmp_path: Any, reward_first: bool) -> None:
    """A reward logged by key (no trace id) joins the trajectory of that key in whichever file holds it: a
    shard holding one, or joining a covered one, is never merged in alone."""
    run = os.fspath(tmp_path)
    trajectory = [_span("k0", 0, 3, False), _span("k0", 1, 3, False)]
    by_key = [_reward("", 2, 3, 5.0, False), _span("solo", 0, 8, False)]
    for rows in (by_key, trajectory) if reward_first else (trajectory, by_key):
        write_shard(run, [rows])
    assert _covered(run)
    truth = step_partials(read_trajectories(run))
    assert 5.0 in pc.list_flatten(truth.column(S.PART_REWARDS)).to_pylist()  # the key joined the two files
    equal_tables(read_step_partials(run), truth)
    _same(_answers(run), _without_rollup(run))


def test_an_update_that_died_before_its_rename_leaves_nothing_behind(tmp_path: Any) -> None:
    """A temporary file of a killed update (the old rollup still whole): the next update removes it."""
    run = os.fspath(tmp_path)
    _clean_run(run, 2)
    left = os.path.join(run, f"{R.ROLLUP_NAME}.999999.1.tmp")
    with open(left, "wb") as f:
        f.write(b"ARROW1 half of a rollup")
    assert _covered(run)  # the rollup itself was never touched
    _clean_run(run, 1, step_of=lambda w, t: 30)
    assert not os.path.exists(left)
    assert _covered(run)


def test_a_process_that_seals_dead_writers_shards_leaves_them_rolled_up(tmp_path: Any) -> None:
    """Writers killed after their last flush (Ray workers at shutdown): a reading process seals their shards
    and, before it ends, the rollup covers them all."""
    import subprocess
    import sys

    run = os.fspath(tmp_path)
    for w in range(3):
        rows = [_span(f"d{w}", 0, w, False), _reward(f"d{w}", 1, w, float(w), False)]
        write_shard(run, [rows], close=False)
    assert not os.path.exists(os.path.join(run, R.ROLLUP_NAME))
    code = "import sys, warnings, tracer; warnings.simplefilter('ignore'); tracer.read_trajectories(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, run], check=True, timeout=120)
    roll = run_rollup(run)
    assert roll is not None and len(roll.files) == 3
    equal_tables(read_step_partials(run), step_partials(read_trajectories(run)))
