"""tracer.follow: a follower polled while a run is written sees what a full read sees, reading only new batches."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pyarrow as pa
from follow_fixtures import batch_of, trajectory_rows, writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracer import schema as S
from tracer.follow import RunFollower, step_progress
from tracer.index.readers import read_trajectories
from tracer.storage.files import read_layout


def _full(run_dir: str) -> pa.Table:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_trajectories(run_dir)


trajectory = st.tuples(
    st.integers(0, 3),  # step
    st.integers(0, 2),  # sample
    st.integers(0, 1),  # rollout
    st.integers(0, 2),  # worker
    st.sampled_from(["root", "no root", "keyed reward", "late reward"]),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    trajectories=st.lists(trajectory, min_size=1, max_size=8, unique_by=lambda t: t[:4]),
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    polls=st.lists(st.booleans(), min_size=1, max_size=12),
)
def test_follower_matches_a_full_read_after_every_poll(tmp_path_factory, trajectories, cuts, polls) -> None:
    """Whatever the split into batches, files and polls, the follower's table equals read_trajectories'."""
    run_dir = str(tmp_path_factory.mktemp("run"))
    rows_by_worker: dict[int, list[dict]] = {}
    for step, sample, rollout, worker, shape in trajectories:
        rows = trajectory_rows(step, sample, rollout, f"w{worker}", root=shape != "no root", reward=0.25 * rollout)
        if shape == "keyed reward":  # a reward logged by another process: no trace id, joined by key
            rows[-1] = {**rows[-1], S.TRACE_ID: ""}
        if shape == "late reward":  # a second reward after the trajectory, in a later batch
            rows.append(
                {**rows[-1], S.SPAN_ID: rows[-1][S.SPAN_ID] + "2", S.REWARD: 9.0, S.END_NS: rows[-1][S.END_NS] + 5}
            )
        rows_by_worker.setdefault(worker, []).extend(rows)
    writers = {w: writer(run_dir) for w in rows_by_worker}
    follower = RunFollower(run_dir)
    pending = [(w, rows) for w, rows in rows_by_worker.items()]
    i = 0
    while pending:
        w, rows = pending.pop(0)
        n = cuts[i % len(cuts)]
        writers[w].write(batch_of(rows[:n]))
        if rows[n:]:
            pending.append((w, rows[n:]))
        if polls[i % len(polls)]:
            follower.poll()
            assert follower.trajectories().equals(_full(run_dir))
        i += 1
    for w in writers.values():
        w.close()
    follower.poll()
    assert follower.trajectories().equals(_full(run_dir))
    assert follower.rows == sum(len(r) for r in rows_by_worker.values())


def test_a_poll_reads_only_the_new_batches(tmp_path) -> None:
    """After the first poll, a poll reads the batches written since, not the file again."""
    w = writer(tmp_path)
    for step in range(5):
        w.write(batch_of(trajectory_rows(step, 0, 0)))
    follower = RunFollower(str(tmp_path))
    assert follower.poll().batches == 5
    assert follower.poll().batches == 0
    w.write(batch_of(trajectory_rows(5, 0, 0)))
    update = follower.poll()
    assert (update.batches, update.changed) == (1, ["w-s5-p0-r0"])
    assert follower.steps() == [0, 1, 2, 3, 4, 5]
    w.close()


def test_a_trajectory_without_its_root_is_running_while_its_file_is_open(tmp_path) -> None:
    """No root yet and the file open: running, with its spans so far; closed without a root: abandoned."""
    w = writer(tmp_path)
    w.write(batch_of(trajectory_rows(0, 0, 0) + trajectory_rows(0, 0, 1, root=False, tools=2)))
    follower = RunFollower(str(tmp_path))
    follower.poll()
    running = follower.running(now_ns=trajectory_rows(0, 0, 1)[0][S.START_NS] + 3_000_000_000)
    assert running.column(S.TRACE_ID).to_pylist() == ["w-s0-p0-r1"]
    assert running.column(S.NUM_SPANS).to_pylist() == [5]
    assert 2.9 < running.column("running_s")[0].as_py() < 3.1
    assert len(follower.spans(["w-s0-p0-r1"])) == 5
    progress = step_progress(follower.trajectories(), running)
    assert progress == [{S.STEP: 0, "finished": 1, "running": 1, "abandoned": 0}]
    w.close()
    follower.poll()
    assert follower.running().num_rows == 0
    assert step_progress(follower.trajectories(), follower.running())[0]["abandoned"] == 1


def test_a_replaced_file_makes_the_follower_read_again(tmp_path) -> None:
    """A file the follower read disappears (compaction, removal): the next poll starts over, no row twice."""
    w = writer(tmp_path)
    w.write(batch_of(trajectory_rows(0, 0, 0)))
    w.close()
    follower = RunFollower(str(tmp_path))
    follower.poll()
    os.remove(w.paths[0])
    w2 = writer(tmp_path)
    w2.write(batch_of(trajectory_rows(1, 0, 0)))
    update = follower.poll()
    assert update.reset
    assert follower.trajectories().column(S.STEP).to_pylist() == [1]
    w2.close()


def test_a_batch_still_being_written_is_read_once_it_is_complete(tmp_path) -> None:
    """A shard cut inside its last batch (a write in progress): no warning, that batch read when complete, once."""
    w = writer(tmp_path / "src")
    for step in range(3):
        w.write(batch_of(trajectory_rows(step, 0, 0)))
    w.close()
    data = Path(w.paths[0]).read_bytes()
    live = tmp_path / "live"
    live.mkdir()
    shard = live / os.path.basename(w.paths[0])
    cut = read_layout(w.paths[0]).batches[2][0] + 40  # inside the third batch
    shard.write_bytes(data[:cut])
    follower = RunFollower(str(live))
    first = follower.poll()
    assert first.warnings == []
    assert follower.steps() == [0, 1]
    with open(shard, "ab") as f:
        f.write(data[cut:])
    follower.poll()
    assert follower.steps() == [0, 1, 2]
    assert follower.rows == 3 * len(trajectory_rows(0, 0, 0))
    assert follower.trajectories().equals(_full(str(live)))
