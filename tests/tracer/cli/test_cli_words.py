"""The command line speaks the user's words: every subcommand describes itself, a mistyped run path gets a
did-you-mean, a missing package names its install line, a progress bar never runs into the console's lines."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import tracer
from tracer.cli import build_parser, main
from tracer.cli.errors import missing_package

#: Subcommands that take a run path as ``path``.
RUN_PATH_COMMANDS = {
    "info": [],
    "check": [],
    "compact": [],
    "dataset": ["--out", "ds"],
    "export": ["--to", "console"],
    "rescore": ["--reward", "m:f"],
    "tail": [],
}


def _subparsers() -> dict[str, object]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return dict(sub.choices)  # type: ignore[arg-type]


def test_every_subcommand_has_a_description() -> None:
    """``rollout-trace COMMAND --help`` says what the command does (``info --help`` had none)."""
    for name, parser in _subparsers().items():
        assert getattr(parser, "description", None), name


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    out = tmp_path / "rollout_traces"
    tracer.init(output_dir=str(out), project_name="proj", experiment_name="grpo")

    @tracer.rollout_trace_op(kind="tool")
    def tool(x: int) -> int:
        return x

    with tracer.rollout_trace_attr(step=0, sample_index=0, rollout_n=0):
        tool(1)
    assert tracer.shutdown().ok
    return out / "proj" / "grpo"


@pytest.mark.parametrize("command", sorted(RUN_PATH_COMMANDS))
def test_a_mistyped_run_path_gets_a_did_you_mean(
    command: str, run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every subcommand taking a run path names the closest existing one, with exit status 2."""
    monkeypatch.chdir(run_dir.parent.parent.parent)
    typo = os.path.join("rollout_traces", "prj", "gpro")
    assert main([command, typo, *RUN_PATH_COMMANDS[command]]) == 2
    err = capsys.readouterr().err
    assert f"{typo!r} does not exist" in err, err
    assert f"did you mean {os.path.join('rollout_traces', 'proj', 'grpo')!r}" in err, err
    assert err.count("\n") == 1, err


def test_a_path_with_no_close_match_says_what_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No did-you-mean when nothing is close; the fix is still named."""
    assert main(["info", str(tmp_path / "zzzzzz")]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "give a trace file or a run directory" in err


def test_a_missing_package_names_the_extra_of_the_command() -> None:
    """One mechanism: a ModuleNotFoundError becomes the package's name and the pip line of its extra."""
    demo = missing_package(ModuleNotFoundError("No module named 'transformers'", name="transformers"), "demo")
    assert demo is not None and "'transformers'" in demo and "[demo]" in demo and "pip install" in demo
    export = missing_package(ModuleNotFoundError("x", name="mlflow.tracking"), "export")
    assert export is not None and "'mlflow'" in export and "[mlflow]" in export
    assert missing_package(ImportError("cannot import name 'x'"), "export") is None


def test_demo_without_a_package_prints_its_install_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rollout-trace demo`` with transformers missing prints the pip line, not only "No module named"."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if not installed
    import rollout.cli

    monkeypatch.setattr(rollout.cli, "_check_args", lambda args: None)

    async def needs_transformers(args: object) -> int:
        import transformers  # noqa: F401

        return 0

    monkeypatch.setattr(rollout.cli, "_run", needs_transformers)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "'transformers'" in err and "pip install" in err and "[demo]" in err, err


def test_the_progress_bar_stays_off_the_console_exporters_lines(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal, ``export --to console`` prints its lines and no progress bar between them."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["export", str(run_dir), "--to", "console"]) == 0
    out, err = capsys.readouterr()
    assert "sent 1 trajectories" in out
    assert "\r" not in out + err and "trajectories (" not in err
