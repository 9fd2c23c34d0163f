"""The Compare page, the token diagnostics and the page fixes, driven through Streamlit's AppTest."""

from __future__ import annotations

import os
import subprocess
import sys

import apptest_fixtures
from apptest_fixtures import all_text, frame_with
from compare_fixtures import SPIKE_TOKEN
from streamlit.testing.v1 import AppTest

import tracer
from viewer.cli import streamlit_command

Runs = tuple[str, str, str]


def open_app(path: str | None, **query: str) -> AppTest:
    """Run the app once with these query parameters; it must not raise nor show an error."""
    at = apptest_fixtures.open_app(path, **query)
    assert not at.error, at.error[0].value
    return at


# -- compare -----------------------------------------------------------------------


def test_compare_deep_link_lists_prompts_biggest_regression_first(compare_runs_dir: Runs) -> None:
    """?view=compare&path=A&compare=B lists every prompt with A's and B's numbers, the lost prompt first."""
    _, a, b = compare_runs_dir
    at = open_app(a, view="compare", compare=b)
    df = frame_with(at, "delta")
    assert list(df["sample_index"]) == ["1", "0", "2"]
    first = df.iloc[0]
    assert (first["reward_a"], first["reward_b"], first["delta"]) == (1.0, 0.0, -1.0)
    assert first["question"] == "What is 1 + 0?"
    assert (first["steps_a"], first["steps_b"]) == ("2", "2")
    assert "Compared at step 2 of both runs \\(the last step both have\\)" in all_text(at)
    assert at.query_params["compare"] == [b] or at.query_params["compare"] == b


def test_compare_shows_the_configuration_differences(compare_runs_dir: Runs) -> None:
    """Above the table: the settings whose recorded values differ (lr, a key only one run has)."""
    _, a, b = compare_runs_dir
    diff = frame_with(open_app(a, view="compare", compare=b), "setting")
    rows = {r["setting"]: (r["A"], r["B"]) for r in diff.to_dict("records")}
    assert rows["actor.lr"] == ("1e-06", "3e-06")
    assert rows["seed"][1] == "7"
    assert "actor.clip" not in rows


def test_selecting_a_prompt_shows_both_sides_and_the_answer_diff(compare_runs_dir: Runs) -> None:
    """A selected prompt shows A's and B's rollouts with their final answers and a diff of them."""
    _, a, b = compare_runs_dir
    at = open_app(a, view="compare", compare=b)
    at.session_state["compare_row"] = 0
    at.run()
    assert not at.exception
    text = all_text(at)
    assert "**A**: 2 rollout(s)" in text and "**B**: 2 rollout(s)" in text
    assert any(c.language == "diff" for c in at.code)
    assert "Replay (opens run B)" in [b.label for b in at.get("link_button")]


def test_two_steps_of_one_run_compare_on_the_page(compare_runs_dir: Runs) -> None:
    """step_a/step_b in the URL compare two steps of the same run."""
    _, a, _ = compare_runs_dir
    at = open_app(a, view="compare", compare=a, step_a="1", step_b="2")
    df = frame_with(at, "delta")
    assert set(df["rollouts_a"]) == {2} and set(df["delta"]) == {0.0}
    assert at.query_params["step_a"] in ("1", ["1"])


def test_view_with_two_runs_opens_the_compare_page(compare_runs_dir: Runs) -> None:
    """`rollout-trace view A B` passes B as --compare; the app opens the Compare page with it."""
    _, a, b = compare_runs_dir
    cmd = streamlit_command(a, compare=b)
    assert cmd[cmd.index("--compare") + 1] == os.path.abspath(b)
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from tracer.cli import main; sys.exit(main())", "view", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "compare" in out.stdout


def test_a_tree_of_runs_offers_run_b_from_its_runs(compare_runs_dir: Runs) -> None:
    """Over a folder of runs, the Compare page picks run B among them (not the run shown as A)."""
    root, _, _ = compare_runs_dir
    at = open_app(root, view="compare")
    run_a = at.sidebar.selectbox[0].value
    run_b = next(s for s in at.selectbox if s.label == "Run B").value
    assert run_a != run_b
    frame_with(at, "delta")


# -- token diagnostics -----------------------------------------------------------------------


def _trace_id(run: str, step: int = 1, sample: str = "0", rollout: int = 0) -> str:
    for r in tracer.read_trajectories(run, steps=[step]).to_pylist():
        if (r["sample_index"], r["rollout_n"]) == (sample, rollout):
            return r["trace_id"]
    raise AssertionError("no such trajectory")


def test_token_view_colours_by_recorded_arrays_and_the_mismatch(compare_runs_dir: Runs) -> None:
    """The token view offers logprob, the rollout-vs-trainer mismatch and each logged array as colourings."""
    _, a, _ = compare_runs_dir
    at = open_app(a, trace_id=_trace_id(a))
    choice = next(s for s in at.selectbox if s.label == "Colour tokens by")
    assert choice.options[:2] == ["logprob", "mismatch"]
    assert "entropy" in choice.options and "old_logprobs" in choice.options
    choice.set_value("entropy").run()
    assert not at.exception


def test_worst_tokens_list_the_mismatch_spike_first_and_mark_the_mask(compare_runs_dir: Runs) -> None:
    """The worst-token table puts the token whose trainer logprob is far off first; masked tokens are flagged."""
    _, a, _ = compare_runs_dir
    worst = frame_with(open_app(a, trace_id=_trace_id(a)), "mismatch")
    assert worst.iloc[0]["pos"] == SPIKE_TOKEN
    assert worst.iloc[0]["mismatch"] > 2
    assert list(worst["in_loss"]) == sorted(worst["in_loss"], reverse=True)
    assert not worst[worst["pos"] >= 6]["in_loss"].any()


def test_overview_shows_the_logprob_mismatch_per_step(compare_runs_dir: Runs) -> None:
    """The per-step table carries logprob_mismatch and the largest ratio, as tracer.step_metrics gives them."""
    _, a, _ = compare_runs_dir
    df = frame_with(open_app(a), "logprob_mismatch")
    expected = tracer.step_metrics(tracer.read_trajectories(a), tracer.read_token_stats(a))
    train = df[df["split"] == "train"].set_index("step")
    for (step, _), metrics in expected.items():
        assert train.loc[step, "logprob_mismatch"] == metrics["logprob_mismatch"]
        assert train.loc[step, "logprob_ratio/max"] == metrics["logprob_ratio/max"]


# -- page fixes ---------------------------------------------------------------------------


def test_overview_counts_spans_as_info_and_check_do(compare_runs_dir: Runs) -> None:
    """The spans tile counts every row of the files (log_reward and token-stats rows too), like `check`."""
    _, a, _ = compare_runs_dir
    metrics = {m.label: m.value for m in open_app(a).metric}
    rows = tracer.read_spans(a, columns=["step"]).num_rows
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from tracer.cli import main; sys.exit(main())", "check", a],
        capture_output=True,
        text=True,
    )
    assert f"{rows} span(s)" in out.stdout
    assert metrics["spans"] == f"{rows:,}"


def test_sidebar_names_the_replayed_trajectorys_step(compare_runs_dir: Runs) -> None:
    """Replaying a step-2 trajectory from a deep link, the sidebar's step says step 2, not all steps."""
    _, a, _ = compare_runs_dir
    at = open_app(a, trace_id=_trace_id(a, step=2))
    step = next(s for s in at.sidebar.selectbox if s.label == "Step")
    assert step.value == 2
    assert at.query_params["step"] in ("2", ["2"])


def test_replay_tiles_show_whole_numbers(compare_runs_dir: Runs) -> None:
    """Tiles hold short values (latency in ms/s with 3 digits), so a narrow tile never cuts them."""
    _, a, _ = compare_runs_dir
    metrics = {m.label: m.value for m in open_app(a, trace_id=_trace_id(a)).metric}
    assert len(metrics["latency"]) <= 9
    assert metrics["reward"] in ("0", "1", "0.0", "1.0")
