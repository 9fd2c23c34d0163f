"""The viewer's data layer and its command line, without Streamlit's runtime."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator

import pyarrow as pa
import pytest
from viewer_fixtures import NEEDLE, record_run, write_tokenizer

import tracer
from viewer import data as D
from viewer.cli import register_view, streamlit_command


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A recorded run: 3 steps, 2 prompts x 4 rollouts + 1 validation rollout per step."""
    path = record_run(tmp_path_factory.mktemp("viewer_data_run"))
    yield path
    tracer.shutdown()


def test_trajectory_summary_matches_read_trajectories(run_dir: str) -> None:
    """The replay's summary from a trajectory's own spans agrees with tracer.read_trajectories."""
    table = D.load_trajectories(run_dir).table
    for row in table.to_pylist():
        spans = D.load_trajectory(run_dir, row[D.TRACE_ID]).table
        summary = D.trajectory_summary(spans)
        assert summary is not None
        for key in (D.STEP, D.SAMPLE_INDEX, D.ROLLOUT_N, D.REWARD, D.STATUS, D.NUM_SPANS, D.NUM_LLM_CALLS):
            assert summary[key] == row[key], key
        assert summary[D.NUM_TOOL_ERRORS] == row[D.NUM_TOOL_ERRORS]
        assert summary[D.ADVANTAGE_COL] == row[D.ADVANTAGE_COL]


def test_trace_file_index_finds_a_trajectory_in_its_own_file(tmp_path: str) -> None:
    """With several files, the index names the one file holding a trajectory, and reading it gives all its spans."""
    run = record_run(tmp_path, steps=1, prompts=1, group=2)
    record_run(tmp_path, steps=1, prompts=1, group=2)
    files = tracer.list_trace_files(run)
    assert len(files) == 2
    index = D.trace_file_index(run).table
    tid = D.load_trajectories(run).table.column(D.TRACE_ID)[0].as_py()
    own = D.files_of(index, [tid])
    assert len(own) == 1
    assert D.load_trajectory(run, tid, files=own).table.equals(D.load_trajectory(run, tid).table)


def test_advantages_reads_the_number_from_reward_info() -> None:
    """advantage comes out of reward_info's JSON; missing or non-numeric gives null."""
    info = pa.chunked_array(
        [['{"advantage":0.5,"acc":1.0}', None, '{"acc":1, "advantage": -1.5e-3}', '{"advantage":null}', "x"]]
    )
    assert D.advantages(info).to_pylist() == [0.5, None, -0.0015, None, None]


def test_list_steps_reads_distinct_steps(run_dir: str) -> None:
    """list_steps gives the run's steps in order."""
    assert D.list_steps(run_dir).table.column(D.STEP).to_pylist() == [1, 2, 3]


def test_step_table_has_tools_and_advantage(run_dir: str) -> None:
    """A step's table names each trajectory's tools and carries its advantage."""
    t = D.load_step(run_dir, 2).table
    assert t.num_rows == 9
    rows = {(r[D.SAMPLE_INDEX], r[D.ROLLOUT_N]): r for r in t.to_pylist() if not r[D.VALIDATE]}
    assert rows[("1", 3)][D.TOOLS_COL] == ["search"]
    assert rows[("0", 0)][D.TOOLS_COL] == ["calculator"]
    assert rows[("0", 0)][D.ADVANTAGE_COL] == -0.5


def test_search_finds_text_in_one_step_only(run_dir: str) -> None:
    """Search looks in the chosen step's conversations only."""
    assert D.search_trace_ids(run_dir, NEEDLE.upper(), [2]).table.num_rows == 1
    assert D.search_trace_ids(run_dir, NEEDLE, [1]).table.num_rows == 0


def test_sort_and_page_puts_nulls_last_and_clamps_pages(run_dir: str) -> None:
    """Pages are clamped to the last one; rows without reward sort last either way."""
    t = pa.table(
        {D.STEP: [1, 1, 1], D.SAMPLE_INDEX: ["0", "1", "2"], D.ROLLOUT_N: [0, 0, 0], D.REWARD: [0.5, None, 1.0]}
    )
    page, pages = D.sort_and_page(t, "reward", True, 0, 2)
    assert pages == 2
    assert page.column(D.REWARD).to_pylist() == [1.0, 0.5]
    last, _ = D.sort_and_page(t, "reward", False, 99, 2)
    assert last.column(D.REWARD).to_pylist() == [None]


def test_token_turns_mark_truncation_and_keep_logprobs(run_dir: str) -> None:
    """Each llm turn lists its kept token ids, logprobs, and the recorded length before truncation."""
    tid = D.load_step(run_dir, 1).table.column(D.TRACE_ID)[0].as_py()
    turns = D.token_turns(D.load_trajectory(run_dir, tid).table)
    assert len(turns) == 2
    first = turns[0]
    assert first.token_ids == [100, 101, 102, 103, 104, 105, 106, 107]
    assert first.truncated and first.recorded == 12 and first.kept == 8
    cells = first.cells()
    assert [c["label"] for c in cells][:2] == ["100", "101"]
    assert cells[1]["logprob"] == pytest.approx(-0.05)


def test_token_turns_show_each_token_text_with_a_tokenizer(run_dir: str, tmp_path: str) -> None:
    """With a tokenizer.json, each token id of the token view gets its own text."""
    pytest.importorskip("tokenizers")
    decoder = D.load_token_decoder(write_tokenizer(tmp_path))
    tid = D.load_step(run_dir, 1).table.column(D.TRACE_ID)[0].as_py()
    first = D.token_turns(D.load_trajectory(run_dir, tid).table, decoder)[0]
    assert first.token_texts == [f"w{i}" for i in range(100, 108)]
    assert [c["label"] for c in first.cells()][:2] == ["w100", "w101"]


def test_load_token_decoder_names_a_missing_file(tmp_path: str) -> None:
    """A tokenizer path without tokenizer.json raises FileNotFoundError naming it."""
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        D.load_token_decoder(os.fspath(tmp_path))


def test_waterfall_orders_spans_and_nests_children(run_dir: str) -> None:
    """The waterfall starts at the root at 0 ms; children are one level deeper."""
    tid = D.load_step(run_dir, 1).table.column(D.TRACE_ID)[0].as_py()
    rows = D.waterfall(D.load_trajectory(run_dir, tid).table)
    assert rows[0]["kind"] == "rollout" and rows[0]["start_ms"] == 0 and rows[0]["depth"] == 0
    assert {r["depth"] for r in rows[1:]} == {1}


def test_escape_markdown_keeps_text_literal() -> None:
    """Markdown and HTML specials are backslash-escaped, so nothing renders as markup."""
    out = D.escape_markdown("<b>x</b> **y** [a](http://e)")
    assert "<" not in out.replace("\\<", "")
    assert "*" not in out.replace("\\*", "")
    assert out.replace("\\", "") == "<b>x</b> **y** [a](http://e)"


def test_file_signature_names_the_fix_for_an_empty_directory(tmp_path: str) -> None:
    """An empty directory raises ViewerPathError saying how to record a run."""
    with pytest.raises(D.ViewerPathError, match="no trace files"):
        D.file_signature(os.fspath(tmp_path))


def test_resolve_path_prefers_url_then_argument_then_environment() -> None:
    """The URL's path wins over the --path argument, which wins over ROLLOUT_TRACE_DIR."""
    env = {tracer.ENV_TRACE_DIR: "/env"}
    assert D.resolve_path("/url", ["/arg"], env) == "/url"
    assert D.resolve_path(None, ["/arg"], env) == "/arg"
    assert D.resolve_path(None, [], env) == "/env"
    assert D.resolve_path(None, [], {}) is None


def test_view_command_serves_on_localhost(tmp_path: str) -> None:
    """`rollout-trace view PATH` runs streamlit on 127.0.0.1 with the path after --."""
    parser = argparse.ArgumentParser()
    register_view(parser.add_subparsers())
    args = parser.parse_args(["view", os.fspath(tmp_path), "--port", "8999"])
    cmd = streamlit_command(args.path, args.host, args.port)
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.port") + 1] == "8999"
    assert cmd[cmd.index("--") + 1 :] == ["--path", os.path.abspath(os.fspath(tmp_path))]


def test_view_command_rejects_a_missing_path(tmp_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A path that does not exist exits with 2 and says so, without starting a server."""
    parser = argparse.ArgumentParser()
    register_view(parser.add_subparsers())
    args = parser.parse_args(["view", os.path.join(os.fspath(tmp_path), "missing")])
    assert args.func(args) == 2
    assert "does not exist" in capsys.readouterr().err


def test_view_is_a_rollout_trace_subcommand() -> None:
    """The installed console script lists `view` (entry point rollout_trace.commands)."""
    script = os.path.join(os.path.dirname(sys.executable), "rollout-trace")
    if not os.path.exists(script):
        pytest.skip("the rollout-trace console script is not installed (pip install -e .)")
    out = subprocess.run([script, "view", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--port" in out.stdout and "127.0.0.1" in out.stdout
