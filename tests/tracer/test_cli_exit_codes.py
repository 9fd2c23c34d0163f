"""Every ``rollout-trace`` subcommand, given bad input, prints a message (no traceback) and exits with the documented code.

The codes are docs/cli.md's table (``tracer.cli.errors``): 0 ok, 1 the command
ran and found or left a problem, 2 bad input or environment. Each case runs
the installed ``rollout-trace`` script in a subprocess, as a user would.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from export_fixtures import record_run
from server_fixtures import free_port
from storage_fixtures import copy_run

from tracer.cli.errors import EXIT_PROBLEM, EXIT_USAGE

SCRIPT = str(Path(sys.executable).with_name("rollout-trace"))


def _run(args: list[str], cwd: Path, preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": "", "ROLLOUT_TRACE_DEBUG": ""}
    return subprocess.run(
        [SCRIPT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, preexec_fn=preexec
    )


def subcommands() -> list[str]:
    """The subcommands ``rollout-trace --help`` lists."""
    out = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, check=True).stdout
    listed = out.split("positional arguments:", 1)[1].split("options:", 1)[0]
    return re.findall(r"^    (\w+) ", listed, flags=re.MULTILINE)


@pytest.fixture(scope="module")
def area(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with an empty dir, a text file, a file named .arrow that is not one, and a recorded run."""
    root = tmp_path_factory.mktemp("cli-exit")
    (root / "empty").mkdir()
    (root / "notes.txt").write_text("not a trace\n")
    (root / "junk.arrow").write_bytes(b"junk" * 10)
    record_run(root / "traces")
    return root


def _run_dir(area: Path) -> str:
    return str(next(p.parent for p in (area / "traces").rglob("*.arrow")))


#: subcommand -> (argv, expected exit status) with bad input; {run} is a recorded run, {port} a closed port.
CASES: dict[str, list[tuple[list[str], int]]] = {
    "info": [(["info", "missing"], EXIT_USAGE), (["info", "empty"], EXIT_USAGE), (["info", "notes.txt"], EXIT_USAGE)],
    "check": [
        (["check", "missing"], EXIT_USAGE),
        (["check", "empty"], EXIT_USAGE),
        (["check", "junk.arrow"], EXIT_PROBLEM),
    ],
    "compact": [
        (["compact", "missing"], EXIT_USAGE),
        (["compact", "empty"], EXIT_USAGE),
        (["compact", "notes.txt"], EXIT_USAGE),
    ],
    "diff": [(["diff", "empty", "missing"], EXIT_USAGE), (["diff", "{run}", "{run}", "--steps-a", "x"], EXIT_USAGE)],
    "dataset": [
        (["dataset", "missing", "--out", "o"], EXIT_USAGE),
        (["dataset", "{run}", "--out", "o", "--steps", "zz"], EXIT_USAGE),
    ],
    "demo": [(["demo", "--steps", "0"], EXIT_USAGE), (["demo", "--engine", "hf"], EXIT_USAGE)],
    "export": [
        (["export", "empty", "--to", "mlflow", "--tracking-uri", "sqlite:///m.db"], EXIT_USAGE),
        (["export", "empty", "--to", "console"], EXIT_USAGE),
        (["export", "junk.arrow", "--to", "mlflow", "--tracking-uri", "sqlite:///m.db", "--no-progress"], EXIT_USAGE),
        (["export", "{run}", "--to", "nowhere"], EXIT_USAGE),
        (
            ["export", "{run}", "--to", "mlflow", "--tracking-uri", "http://127.0.0.1:{port}", "--no-progress"],
            EXIT_USAGE,
        ),
    ],
    "import": [
        (["import", "mlflow", "--tracking-uri", "foo://x", "--experiment", "e", "--out", "o"], EXIT_USAGE),
        (
            ["import", "mlflow", "--tracking-uri", "http://127.0.0.1:{port}", "--experiment", "e", "--out", "o"],
            EXIT_USAGE,
        ),
        (["import", "mlflow", "--tracking-uri", "sqlite:///m2.db", "--experiment", "nope", "--out", "o"], EXIT_USAGE),
    ],
    "bundle": [
        (["bundle", "missing", "-o", "out.html"], EXIT_USAGE),
        (["bundle", "empty", "-o", "out.html"], EXIT_USAGE),
        (["bundle", "{run}", "--trace-id", "nope", "-o", "out.html"], EXIT_USAGE),
        (["bundle", "{run}", "-o", "out.html", "--max-mb", "0.000001"], EXIT_USAGE),
    ],
    "rescore": [
        (["rescore", "missing", "--reward", "a:b"], EXIT_USAGE),
        (["rescore", "{run}", "--reward", "nomodule:f"], EXIT_USAGE),
    ],
    "tail": [(["tail", "missing"], EXIT_USAGE), (["tail", "{run}", "--interval", "0"], EXIT_USAGE)],
    "upload": [(["upload", "missing"], EXIT_USAGE), (["upload", "empty"], EXIT_USAGE)],
    "view": [
        (["view", "empty", "--port", "99999999"], EXIT_USAGE),
        (["view", "missing"], EXIT_USAGE),
        (["view", "{run}", "--follow", "--interval", "0"], EXIT_USAGE),
    ],
}


def test_every_subcommand_has_cases() -> None:
    """A new subcommand needs its bad-input cases here."""
    assert sorted(subcommands()) == sorted(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(CASES))
def test_bad_input_gives_a_message_and_the_documented_code(command: str, area: Path) -> None:
    port = str(free_port())  # nothing listens there
    for argv, code in CASES[command]:
        args = [a.replace("{run}", _run_dir(area)).replace("{port}", port) for a in argv]
        proc = _run(args, area)
        assert "Traceback" not in proc.stderr + proc.stdout, (args, proc.stderr)
        assert proc.returncode == code, (args, proc.returncode, proc.stderr)
        assert (proc.stderr + proc.stdout).strip(), (args, "no message")


def test_no_arguments_prints_help_and_exits_2(tmp_path: Path) -> None:
    proc = _run([], tmp_path)
    assert proc.returncode == EXIT_USAGE and "usage:" in proc.stdout


def _small_files() -> None:
    """In the child: writes past 4 KB fail with EFBIG (a disk that fills up), instead of killing the process."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


@pytest.mark.slow
def test_compact_on_a_full_disk_says_so_and_keeps_the_files(area: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    copy_run(_run_dir(area), run)
    before = sorted(p.name for p in run.rglob("*.arrow"))
    proc = _run(["compact", str(run), "--target-mb", "64"], tmp_path, preexec=_small_files)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == EXIT_USAGE, (proc.returncode, proc.stdout, proc.stderr)
    assert "error:" in proc.stderr
    assert sorted(p.name for p in run.rglob("*.arrow")) == before
