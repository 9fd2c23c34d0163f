"""The viewer app, driven through Streamlit's AppTest over a run recorded with tracer."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from apptest_fixtures import all_text, frame_with, open_app
from storage_fixtures import copy_run
from viewer_fixtures import HOSTILE_TEXT, NEEDLE, record_long_trajectory, record_run, write_tokenizer

import tracer
from viewer import data as D

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A recorded run: 3 steps, 2 prompts x 4 rollouts + 1 validation rollout per step."""
    path = record_run(tmp_path_factory.mktemp("viewer_run"))
    yield path
    tracer.shutdown()


def trace_id_of(path: str, step: int, sample: str, rollout: int) -> str:
    t = tracer.read_trajectories(path, steps=[step])
    for r in t.to_pylist():
        if r["sample_index"] == sample and r["rollout_n"] == rollout and not r["validate"]:
            return r["trace_id"]
    raise AssertionError("no such trajectory")


# -- overview ------------------------------------------------------------------


def test_overview_shows_run_totals(run_dir: str) -> None:
    """The overview's headline numbers count the run's steps, trajectories and tool errors."""
    at = open_app(run_dir)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["steps"] == "3"
    assert metrics["trajectories"] == "27"
    assert metrics["tool error rate"] == "23.1%"  # 6 of 26 calls
    assert metrics["failed trajectories"] == "1"


def test_overview_draws_charts_and_step_table(run_dir: str) -> None:
    """The overview draws reward/turn/error/latency charts and a per-step table for both splits."""
    at = open_app(run_dir)
    assert len(at.get("vega_lite_chart")) == 5
    table = frame_with(at, "reward/mean")
    assert sorted(set(table["split"])) == ["train", "validation"]
    assert list(table[table["split"] == "train"]["reward/mean"]) == [0.5, 0.5, 0.5]


# -- trajectory list -------------------------------------------------------------


def test_step_deep_link_lists_that_step(run_dir: str) -> None:
    """?step=2 opens the trajectory list of step 2 only."""
    at = open_app(run_dir, step="2")
    df = at.dataframe(key="list_table").value
    assert len(df) == 9
    assert set(df["step"]) == {2}


def test_list_filters_by_reward(run_dir: str) -> None:
    """The reward range keeps only trajectories inside it."""
    at = open_app(run_dir, step="1", validate="false")
    at.slider(key="f_reward").set_value((1.0, 1.0)).run()
    df = at.dataframe(key="list_table").value
    assert len(df) == 4
    assert set(df["reward"]) == {1.0}


def test_list_filters_by_tool_used(run_dir: str) -> None:
    """'Tool used' keeps the trajectories that called that tool."""
    at = open_app(run_dir, step="1")
    at.multiselect(key="f_tools").set_value(["search"]).run()
    df = at.dataframe(key="list_table").value
    assert len(df) == 2
    assert set(df["tools"]) == {"search"}
    assert set(df["sample"]) == {"1"}


def test_list_filters_by_split(run_dir: str) -> None:
    """The split selector keeps validation rollouts only."""
    at = open_app(run_dir, view="trajectories")
    at.sidebar.radio(key="split").set_value("validation").run()
    df = at.dataframe(key="list_table").value
    assert len(df) == 3
    assert set(df["split"]) == {"validation"}


def test_list_filters_by_number_of_turns(run_dir: str) -> None:
    """The turns range keeps trajectories with that many llm turns."""
    at = open_app(run_dir, step="3")
    at.slider(key="f_turns").set_value((3, 3)).run()
    df = at.dataframe(key="list_table").value
    assert len(df) == 2
    assert set(df["turns"]) == {3}
    assert set(df["rollout"]) == {3}


def test_list_filters_by_status(run_dir: str) -> None:
    """The status filter keeps the trajectory whose rollout raised."""
    at = open_app(run_dir, view="trajectories")
    at.multiselect(key="f_status").set_value(["error"]).run()
    df = at.dataframe(key="list_table").value
    assert len(df) == 1
    assert (df.iloc[0]["step"], df.iloc[0]["split"]) == (3, "validation")


def test_list_full_text_search_finds_conversation(run_dir: str) -> None:
    """Searching a word from one conversation lists exactly that trajectory."""
    at = open_app(run_dir, view="trajectories")
    at.text_input(key="q").input(NEEDLE).run()
    df = at.dataframe(key="list_table").value
    assert len(df) == 1
    row = df.iloc[0]
    assert (row["step"], row["sample"], row["rollout"]) == (2, "1", 3)


def test_list_sorts_by_reward_descending(run_dir: str) -> None:
    """Sorting by reward, descending, puts the highest rewards first."""
    at = open_app(run_dir, step="2", validate="false")
    at.selectbox(key="sort").set_value("reward")
    at.toggle(key="desc").set_value(True).run()
    rewards = list(at.dataframe(key="list_table").value["reward"])
    assert rewards == sorted(rewards, reverse=True)


def test_list_is_paged_on_the_server(run_dir: str) -> None:
    """Only one page of rows reaches the page; the next page holds the rest."""
    at = open_app(run_dir, view="trajectories")
    assert len(at.dataframe(key="list_table").value) == 25
    at.number_input(key="page").set_value(2).run()
    assert len(at.dataframe(key="list_table").value) == 2


def test_opening_a_listed_trajectory_shows_its_replay(run_dir: str) -> None:
    """Choosing a trajectory in the list opens its replay and puts its id in the URL."""
    at = open_app(run_dir, step="1")
    tid = at.dataframe(key="list_table").value["trace_id"][2]
    at.selectbox(key="pick").set_value(tid)
    at.button(key="open_pick").click().run()
    assert at.query_params["trace_id"] == [tid] or at.query_params["trace_id"] == tid
    assert at.session_state["view"] == "Replay"
    assert len(at.chat_message) == 5


# -- replay ----------------------------------------------------------------------


def test_trace_id_deep_link_replays_the_conversation(run_dir: str) -> None:
    """?trace_id= shows the conversation turn by turn with each role."""
    at = open_app(run_dir, trace_id=trace_id_of(run_dir, 1, "0", 2))
    assert [c.name for c in at.chat_message] == ["system", "user", "assistant", "tool", "assistant"]
    assert at.chat_message[1].text[0].value == "What is 0 + 2?"


def test_replay_shows_tool_call_arguments_and_results(run_dir: str) -> None:
    """Tool calls show their arguments and the tool's result."""
    at = open_app(run_dir, trace_id=trace_id_of(run_dir, 1, "0", 2))
    text = all_text(at)
    assert '"expression": "0 + 2"' in text
    assert "tool call: calculator" in text.replace("\\", "")
    assert "2" in [c.value for c in at.code]


def test_replay_shows_tool_error_with_traceback(run_dir: str) -> None:
    """A failed tool call is flagged as an error, with its traceback."""
    at = open_app(run_dir, trace_id=trace_id_of(run_dir, 1, "0", 1))
    errors = [e.value.replace("\\", "") for e in at.error]
    assert any("calculator failed: ZeroDivisionError: division by zero" in e for e in errors)
    assert any(c.value.startswith("Traceback (most recent call last)") for c in at.code)


def test_replay_token_view_marks_truncation(run_dir: str) -> None:
    """The token view counts kept and recorded tokens and marks truncation."""
    at = open_app(run_dir, trace_id=trace_id_of(run_dir, 1, "0", 2))
    heads = [m.value.replace("\\", "") for m in at.markdown]
    assert any("8 token(s) kept of 12" in h for h in heads)
    assert any("Truncated" in w.value for w in at.warning)


def test_replay_token_view_uses_a_tokenizer_from_the_url(run_dir: str, tmp_path: str) -> None:
    """?tokenizer= gives the token view each token's text; a bad one leaves ids with a note."""
    pytest.importorskip("tokenizers")
    tid = trace_id_of(run_dir, 1, "0", 2)
    at = open_app(run_dir, trace_id=tid, tokenizer=write_tokenizer(tmp_path))
    assert not at.error
    charts = b"".join(c.proto.SerializeToString() for c in at.get("vega_lite_chart"))
    assert b"w100" in charts and b"w117" in charts
    at = open_app(run_dir, trace_id=tid, tokenizer=os.fspath(tmp_path / "missing"))
    assert any("Token text unavailable" in c.value.replace("\\", "") for c in at.caption)


def test_replay_draws_waterfall_and_token_charts(run_dir: str) -> None:
    """The replay draws a span waterfall and a token chart per llm turn."""
    at = open_app(run_dir, trace_id=trace_id_of(run_dir, 1, "0", 2))
    assert len(at.get("vega_lite_chart")) == 3
    spans = frame_with(at, "duration_ms")
    assert list(spans["kind"]) == ["rollout", "llm", "tool", "llm", "reward"]


def test_model_text_is_shown_as_text_not_html(run_dir: str) -> None:
    """Model output with HTML and Markdown is shown literally; no element allows HTML."""
    at = open_app(run_dir, trace_id=trace_id_of(run_dir, 1, "0", 0))
    assert at.chat_message[4].text[0].value == HOSTILE_TEXT
    for md in at.markdown:
        assert not md.proto.allow_html
        assert "<script>" not in md.value


def test_replay_of_a_crashed_rollout_shows_its_error(run_dir: str) -> None:
    """A rollout whose root raised shows the exception and what was recorded before it."""
    t = tracer.read_trajectories(run_dir, steps=[3], validate=True)
    at = open_app(run_dir, trace_id=t.column("trace_id")[0].as_py())
    errors = [e.value.replace("\\", "") for e in at.error]
    assert any("RuntimeError: validation rollout crashed" in e for e in errors)
    assert {m.label: m.value for m in at.metric}["status"] == "error"


def test_replay_in_a_run_of_many_files(tmp_path: str) -> None:
    """A run written by several processes (many files) still replays a trajectory in full."""
    run = ""
    for _ in range(3):
        run = record_run(tmp_path, steps=1, prompts=1, group=2)
    assert len(tracer.list_trace_files(run)) == 3
    tid = tracer.read_trajectories(run).column("trace_id")[4].as_py()
    at = open_app(run, trace_id=tid)
    assert [c.name for c in at.chat_message] == ["system", "user", "assistant", "tool", "assistant"]


def test_replay_of_a_long_trajectory_caps_what_the_browser_draws(tmp_path: str) -> None:
    """A root, 400 tool spans and a 5,000-token response are drawn capped, with a note saying so."""
    run = record_long_trajectory(tmp_path)
    tid = tracer.read_trajectories(run).column("trace_id")[0].as_py()
    at = open_app(run, trace_id=tid)
    captions = " ".join(c.value for c in at.caption)
    assert "Showing the first 300 of 402 spans" in captions
    assert "the first 4,096 of 5,000 tokens" in captions
    assert len(frame_with(at, "duration_ms")) == 402


def test_unknown_trace_id_says_so(run_dir: str) -> None:
    """A deep link to a trace id that is not in the run gives a clear error."""
    at = open_app(run_dir, trace_id="f" * 32)
    assert "No trajectory with trace id" in at.error[0].value.replace("\\", "")


# -- group view ------------------------------------------------------------------


def test_group_deep_link_shows_rollouts_with_reward_and_advantage(run_dir: str) -> None:
    """?step=&sample_index= shows the prompt's rollouts side by side with reward and advantage."""
    at = open_app(run_dir, step="1", sample_index="0", validate="false")
    df = frame_with(at, "advantage")
    assert list(df["rollout"]) == [0, 1, 2, 3]
    assert list(df["reward"]) == [1.0, 0.0, 1.0, 0.0]
    assert list(df["advantage"]) == [0.5, -0.5, 0.5, -0.5]
    cards = [m.value for m in at.markdown if m.value.startswith("rollout")]
    assert len(cards) == 4
    assert HOSTILE_TEXT in [t.value for t in at.text]


def test_group_shows_the_sample_across_steps(run_dir: str) -> None:
    """The group view lists the same sample at every step."""
    at = open_app(run_dir, step="2", sample_index="1", validate="false")
    across = frame_with(at, "reward mean")
    assert list(across["step"]) == [1, 2, 3]
    assert list(across["rollouts"]) == [4, 4, 4]


def test_group_replay_button_opens_the_rollout(run_dir: str) -> None:
    """A rollout's Replay button in the group view opens that trajectory."""
    at = open_app(run_dir, step="1", sample_index="0", validate="false")
    tid = trace_id_of(run_dir, 1, "0", 3)
    at.button(key=f"replay_{tid}").click().run()
    assert at.session_state["view"] == "Replay"
    assert at.session_state["trace_id"] == tid


def test_replay_group_button_opens_the_group(run_dir: str) -> None:
    """The replay's group button opens the prompt's group at that step."""
    at = open_app(run_dir, trace_id=trace_id_of(run_dir, 3, "1", 0))
    at.button(key="to_group").click().run()
    assert at.session_state["view"] == "Group"
    assert at.query_params["sample_index"] in ("1", ["1"])
    assert len(frame_with(at, "advantage")) == 4


# -- paths and damaged data ------------------------------------------------------


def test_a_tree_of_runs_offers_one_run_at_a_time(tmp_path: str) -> None:
    """A directory holding several runs shows the newest; ?run= or the Run selector picks another."""
    record_run(tmp_path, steps=1, prompts=1, group=2, experiment="older")
    os.utime(tracer.list_trace_files(os.path.join(os.fspath(tmp_path), "viewer-test", "older"))[0], (1, 1))
    record_run(tmp_path, steps=2, prompts=1, group=2, experiment="newer")
    root = os.fspath(tmp_path)
    at = open_app(root)
    assert at.sidebar.selectbox(key="run_sel").value == os.path.join("viewer-test", "newer")
    assert {m.label: m.value for m in at.metric}["steps"] == "2"
    at.sidebar.selectbox(key="run_sel").set_value(os.path.join("viewer-test", "older")).run()
    assert {m.label: m.value for m in at.metric}["steps"] == "1"
    assert at.query_params["run"] in (os.path.join("viewer-test", "older"), [os.path.join("viewer-test", "older")])
    at = open_app(root, run=os.path.join("viewer-test", "older"))
    assert {m.label: m.value for m in at.metric}["steps"] == "1"


def test_empty_directory_gives_a_clear_message(tmp_path: str) -> None:
    """A directory without trace files says so and how to fix it."""
    at = open_app(os.fspath(tmp_path))
    assert "no trace files" in at.error[0].value.replace("\\", "")


def test_missing_path_gives_a_clear_message(tmp_path: str) -> None:
    """A path that does not exist says so."""
    at = open_app(os.path.join(os.fspath(tmp_path), "nope"))
    assert "does not exist" in at.error[0].value.replace("\\", "")


def test_no_path_explains_how_to_give_one() -> None:
    """Without a path the app explains the three ways to give one."""
    at = open_app(None)
    assert "ROLLOUT_TRACE_DIR" in at.info[0].value


def test_path_from_environment(run_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ROLLOUT_TRACE_DIR is used when no path is given."""
    monkeypatch.setenv(tracer.ENV_TRACE_DIR, run_dir)
    at = open_app(None)
    assert {m.label: m.value for m in at.metric}["trajectories"] == "27"


def test_corrupt_file_is_reported_and_the_rest_shown(run_dir: str, tmp_path: str) -> None:
    """A garbage file and a torn file get a warning; the readable trajectories are still shown."""
    copy = os.path.join(os.fspath(tmp_path), "run")
    copy_run(run_dir, copy)
    good = tracer.list_trace_files(copy)[0]
    with open(os.path.join(copy, "garbage.arrow"), "wb") as f:
        f.write(b"this is not an arrow file" * 10)
    with open(good, "rb") as f:
        data = f.read()
    with open(os.path.join(copy, "torn.arrow"), "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    at = open_app(copy)
    warnings = " ".join(w.value.replace("\\", "") for w in at.warning)
    assert "garbage.arrow" in warnings
    assert "torn.arrow" in warnings
    assert int({m.label: m.value for m in at.metric}["trajectories"]) >= 27


def test_golden_sample_file_opens() -> None:
    """The committed golden trace file in sample_data/golden/ opens in the viewer."""
    golden = os.path.join(REPO, "sample_data", "golden")
    if not os.path.isdir(golden) or not tracer.list_trace_files(golden):
        pytest.skip("sample_data/golden/ holds no trace files")
    at = open_app(golden)
    assert int({m.label: m.value for m in at.metric}["trajectories"].replace(",", "")) > 0
    tid = D.load_trajectories(golden).table.column(D.TRACE_ID)[0].as_py()
    at = open_app(golden, trace_id=tid)
    assert not at.error


def _recorded_sample_runs() -> list[str]:
    """Directories under sample_data/ (other than the golden file's) holding trace files."""
    root = os.path.join(REPO, "sample_data")
    runs = set()
    for d, _, files in os.walk(root):
        if os.path.basename(d) != "golden" and any(f.endswith(".arrow") for f in files):
            runs.add(d)
    return sorted(runs)


def test_recorded_sample_run_replays() -> None:
    """The run recorded into sample_data/ by the rollout code opens: overview, a step, a replay, a group."""
    runs = _recorded_sample_runs()
    if not runs:
        pytest.skip("sample_data/ holds no recorded run yet (only the golden file)")
    for run in runs:
        table = D.load_trajectories(run).table
        assert table.num_rows > 0, run
        at = open_app(run)
        assert not at.error, [e.value for e in at.error]
        first = table.slice(0, 1).to_pylist()[0]
        at = open_app(run, trace_id=first[D.TRACE_ID])
        roles = [c.name for c in at.chat_message]
        assert "assistant" in roles, roles
        if first[D.STEP] is not None:
            at = open_app(run, step=str(first[D.STEP]), sample_index=str(first[D.SAMPLE_INDEX]))
            assert len(frame_with(at, "advantage")) >= 1
