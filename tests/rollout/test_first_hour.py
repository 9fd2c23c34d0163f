"""What a newcomer meets first: the demo's printed next steps run as printed, hints that work, plain errors."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import free_port, serving

import tracer
from tracer.cli import main as rollout_trace_main
from tracer.extras import install_command

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop(tracer.ENV_TRACE_DIR, None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _cli(*args: str) -> list[str]:
    """``rollout-trace ARGS`` as this interpreter runs it (the console script's own code)."""
    return [sys.executable, "-c", "import sys; from tracer.cli import main; sys.exit(main())", *args]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, tokenizer_cache: str) -> dict[str, Any]:  # noqa: F811
    """`rollout-trace demo` run in a subprocess from an empty folder, as a user runs it."""
    cwd = tmp_path_factory.mktemp("first-hour")
    proc = subprocess.run(
        _cli("demo", "--steps", "1", "--batch", "2", "--n", "2", "--val-every", "0", "--cache", tokenizer_cache,
             "--scripted-latency", "0", "--experiment", "e1"),
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    steps = {}
    for line in lines:
        m = re.match(r"\s+(view|export|summary):\s+(rollout-trace [^#]*?)\s*(#.*)?$", line)
        if m:
            steps[m.group(1)] = m.group(2).split()[1:]
    return {"proc": proc, "cwd": cwd, "steps": steps, "run_dir": cwd / "rollout_traces" / "rollout-demo" / "e1"}


@pytest.mark.slow
def test_demo_prints_three_next_steps(demo: dict[str, Any]) -> None:
    """The demo exits 0 and prints the view, export and summary commands for its run."""
    assert demo["proc"].returncode == 0, demo["proc"].stderr
    assert set(demo["steps"]) == {"view", "export", "summary"}
    assert "first:" not in demo["proc"].stdout  # everything they need is installed here


@pytest.mark.slow
def test_printed_summary_step_runs_as_printed(demo: dict[str, Any]) -> None:
    """`rollout-trace info RUN`, exactly as printed, exits 0 and counts the demo's 4 trajectories."""
    proc = subprocess.run(_cli(*demo["steps"]["summary"]), cwd=demo["cwd"], env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "4" in proc.stdout


@pytest.mark.slow
def test_printed_export_step_runs_as_printed_into_mlflow_db(demo: dict[str, Any]) -> None:
    """`rollout-trace export RUN --to mlflow`, exactly as printed, writes ./mlflow.db and says how it sent them in plain words."""
    proc = subprocess.run(
        _cli(*demo["steps"]["export"], "--no-progress"), cwd=demo["cwd"], env=_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (demo["cwd"] / "mlflow.db").is_file()
    assert "sent 4 trajectories" in proc.stdout
    assert "via the fast path" not in proc.stdout


@pytest.mark.slow
def test_printed_view_step_serves_the_run(demo: dict[str, Any]) -> None:
    """`rollout-trace view RUN` as printed (on a free port) answers HTTP; the run names its tokenizer for the token view."""
    from viewer.data import load_token_decoder, run_tokenizer_path

    port = free_port()
    view = _cli(*demo["steps"]["view"], "--port", str(port))
    with serving(view, demo["cwd"], f"http://127.0.0.1:{port}/_stcore/health", 90, _env()):
        pass  # it answered: serving raises, with the server's output, when it does not
    tok = run_tokenizer_path(str(demo["run_dir"]))
    assert tok is not None, "the demo's run does not record its tokenizer's folder"
    pieces = load_token_decoder(tok)([27, 91, 318, 4906])
    assert "".join(pieces)


def test_next_steps_name_the_install_line_of_a_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without streamlit or mlflow, the printed step says the pip line that installs it into this copy."""
    from rollout.cli import next_steps

    monkeypatch.setitem(sys.modules, "streamlit", None)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    view, export, summary = next_steps("runs/x")
    assert f"# first: {install_command('viewer')}" in view
    assert f"# first: {install_command('mlflow')}" in export
    assert "first:" not in summary


def test_install_command_from_a_clone_installs_the_clone() -> None:
    """Running from this source tree, the hint is an editable install of it (rollout-trace is not on an index)."""
    assert install_command("viewer") == f"pip install -e '{ROOT}[viewer]'"


def test_view_without_streamlit_names_the_install_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`rollout-trace view` exits 2 with the install line when Streamlit is missing."""
    monkeypatch.setitem(sys.modules, "streamlit", None)
    assert rollout_trace_main(["view", str(tmp_path)]) == 2
    assert install_command("viewer") in capsys.readouterr().err


def test_view_of_a_mistyped_run_suggests_the_existing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run path with a typo exits 2 and names the run directory that exists."""
    (tmp_path / "rollout_traces" / "rollout-demo" / "scripted-20260101-120000").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert rollout_trace_main(["view", "rollout_traces/rollout-dmeo/scripted-20260101-12000"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'rollout_traces/rollout-demo/scripted-20260101-120000'" in err


def test_demo_engine_typo_suggests_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    """--engine hff exits 2 and asks whether hf was meant, listing the engines."""
    with pytest.raises(SystemExit) as exc:
        rollout_trace_main(["demo", "--engine", "hff"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "did you mean 'hf'?" in err
    assert "scripted, hf, openai, vllm" in err


@pytest.mark.parametrize("command", ["demo", "view"])
def test_help_ends_with_an_example(command: str) -> None:
    """`rollout-trace demo --help` and `view --help` end with examples of the command."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        rollout_trace_main([command, "--help"])
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    examples = lines[lines.index("examples:") :]
    assert len(examples) >= 2
    assert all(ln.strip().startswith(f"rollout-trace {command}") for ln in examples[1:])


def test_transformers_torch_banner_is_dropped_and_nothing_else() -> None:
    """Importing rollout drops transformers' "PyTorch was not found" banner; its other warnings still show."""
    import rollout  # noqa: F401 - installs the filter

    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("transformers")
    handler = Collect(logging.WARNING)
    logger.addHandler(handler)
    try:
        logger.warning("PyTorch was not found. Models won't be available and only tokenizers, ... can be used.")
        logger.warning("Some other transformers warning")
    finally:
        logger.removeHandler(handler)
    assert seen == ["Some other transformers warning"]


@pytest.mark.slow
def test_viewer_shows_token_text_of_the_demo_run_without_being_told_the_tokenizer(demo: dict[str, Any]) -> None:
    """The replay's token chart of a demo trajectory carries token text, from the tokenizer the run recorded."""
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from viewer.data import load_token_decoder, run_tokenizer_path

    run_dir = str(demo["run_dir"])
    spans = tracer.read_spans(run_dir).to_pylist()
    llm = next(s for s in spans if s["kind"] == "llm")
    ids = json.loads(llm["outputs"])["response_ids"]
    pieces = load_token_decoder(run_tokenizer_path(run_dir) or "")(ids)
    longest = max(pieces, key=len)
    at = AppTest.from_file(str(ROOT / "viewer" / "app.py"), default_timeout=60)
    at.query_params["path"] = run_dir
    at.query_params["trace_id"] = llm["trace_id"]
    at.run()
    assert not at.exception
    charts = b"".join(c.proto.SerializeToString() for c in at.get("vega_lite_chart"))
    assert json.dumps(longest)[1:-1].encode() in charts or longest.encode() in charts
