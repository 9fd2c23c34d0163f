"""Following a run: a writer process records steps while the app reruns on its follow timer (AppTest)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

import pytest
from apptest_fixtures import TIMEOUT, frame_with, new_app, run_app
from export_fixtures import TRAIN_PER_STEP, init_console, lag_on_every_look, record_rollouts, wait_for_lag
from follow_fixtures import WriterProcess
from streamlit.testing.v1 import AppTest

import tracer
from tracer import schema as S
from tracer.exporters import lag
from viewer import state
from viewer.cli import follow_seconds, streamlit_command


@pytest.fixture
def writer(tmp_path: object) -> Iterator[tuple[str, WriterProcess]]:
    run_dir = os.path.join(str(tmp_path), "run")
    os.makedirs(run_dir)
    w = WriterProcess(run_dir)
    yield run_dir, w
    w.close()


def _step_options(at: AppTest) -> list[object]:
    return list(at.sidebar.selectbox(key=state.SS_STEP).options)


def _captions(at: AppTest) -> str:
    return "\n".join(str(c.value) for c in at.caption)


def test_each_new_step_appears_on_the_follow_rerun_and_the_place_is_kept(writer: tuple[str, WriterProcess]) -> None:
    """Steps written while the page follows show up on the timer's rerun; step, view and filter stay as chosen."""
    run_dir, w = writer
    w.say("step 1 2")
    at = new_app()
    at.query_params[state.QP_PATH] = run_dir
    at.query_params[state.QP_FOLLOW] = "1"
    at.query_params[state.QP_INTERVAL] = "1"
    run_app(at)
    assert at.sidebar.toggle(key=state.SS_FOLLOW).value is True
    assert _step_options(at) == [state.ALL_STEPS, "step 1"]
    assert "New since you opened: 0 step(s), 0 trajectories, 0 spans" in _captions(at)
    # The user's place: step 1's trajectory list, filtered to status ok.
    at.sidebar.radio(key=state.SS_VIEW).set_value("Trajectories")
    at.sidebar.selectbox(key=state.SS_STEP).set_value(1)
    run_app(at)
    at.multiselect(key="f_status").set_value([S.STATUS_OK])
    run_app(at)
    for step in (2, 3):
        w.say(f"step {step} 2")
        run_app(at)  # what the follow timer does: rerun the page, no click
        assert len(_step_options(at)) == step + 1
        assert at.sidebar.radio(key=state.SS_VIEW).value == "Trajectories"
        assert at.sidebar.selectbox(key=state.SS_STEP).value == 1
        assert at.multiselect(key="f_status").value == [S.STATUS_OK]
        assert f"New since you opened: {step - 1} step(s), {2 * (step - 1)} trajectories" in _captions(at)
    assert at.query_params[state.QP_FOLLOW] in ("1", ["1"])


def test_a_running_trajectory_is_shown_in_progress_with_its_spans_so_far(writer: tuple[str, WriterProcess]) -> None:
    """The newest step's rollout without a root yet is listed as running, with its spans so far; the chart rows grow."""
    run_dir, w = writer
    w.say("step 1 2")
    at = new_app()
    at.query_params[state.QP_PATH] = run_dir
    at.query_params[state.QP_FOLLOW] = "1"
    run_app(at)
    assert frame_with(at, "reward/mean")[S.STEP].tolist() == [1]
    w.say("open 2")
    w.say("step 2 3")
    run_app(at)
    assert "In progress: step 2" in "\n".join(str(h.value) for h in at.subheader)
    running = frame_with(at, "spans so far")
    assert running[S.TRACE_ID].tolist() == ["w-s2-p9-r0"]
    assert running["spans so far"].tolist() == [1]
    assert [m.value for m in at.metric if m.label in ("rollouts finished", "still running")] == ["3", "1"]
    table = frame_with(at, "reward/mean")
    assert table[S.STEP].tolist() == [1, 2]
    assert table["partial"].tolist() == [False, True]  # step 2 still running: drawn apart, off the lines
    charts = [c.proto.SerializeToString() for c in at.get("vega_lite_chart")]
    assert charts and all(b"still running" in c for c in charts)


def test_the_sidebar_shows_how_far_behind_each_live_exporter_is(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live console exporter holding a step: the sidebar's Live exporters section counts it as waiting."""
    lag_on_every_look(monkeypatch)
    cfg = init_console(str(tmp_path), print_lines=False)
    record_rollouts(steps=(1,), val_per_step=0)
    wait_for_lag(cfg.run_dir, lambda r: r.waiting == TRAIN_PER_STEP, timeout=TIMEOUT)
    at = new_app()
    at.query_params[state.QP_PATH] = cfg.run_dir
    run_app(at)
    labels = [e.label for e in at.sidebar.expander]
    assert f"Live exporters: {TRAIN_PER_STEP} trajectories waiting" in labels
    shown = _captions(at).replace("\\", "")  # captions are escaped Markdown
    assert (
        f"console ({lag.read_lag(cfg.run_dir)[0].host} pid {os.getpid()}): 0 shipped, {TRAIN_PER_STEP} waiting" in shown
    )
    tracer.shutdown()


def test_view_follow_passes_the_interval_to_the_app_and_refuses_a_bad_one() -> None:
    """``view RUN --follow --interval 5`` hands ``--follow 5`` to the app; the interval is clamped or refused."""
    cmd = streamlit_command("run", follow_s=5)
    assert cmd[cmd.index("--follow") + 1] == "5"
    assert "--follow" not in streamlit_command("run")
    assert [state.follow_interval(v) for v in ("0", "2.6", "1e9", "x", "nan")] == [1, 3, 600, None, None]
    with pytest.raises(argparse.ArgumentTypeError, match="outside 1-600 s"):
        follow_seconds("0")


def test_following_switched_off_stays_off_on_a_server_started_with_follow(
    writer: tuple[str, WriterProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``view --follow``: pages open following; switched off, the URL says follow=0, so a reload opens it off."""
    run_dir, w = writer
    w.say("step 1 2")
    monkeypatch.setattr("sys.argv", ["app.py", "--path", run_dir, "--follow", "2"])
    at = run_app(new_app())
    assert at.sidebar.toggle(key=state.SS_FOLLOW).value is True
    at.sidebar.toggle(key=state.SS_FOLLOW).set_value(False)
    run_app(at)
    assert at.query_params[state.QP_FOLLOW] == "0"
    reloaded = new_app()
    reloaded.query_params[state.QP_FOLLOW] = "0"
    assert run_app(reloaded).sidebar.toggle(key=state.SS_FOLLOW).value is False
