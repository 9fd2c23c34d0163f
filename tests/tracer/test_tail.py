"""``rollout-trace tail``: each finished step once, in order, across writer processes; ``--trajectories`` lines; Ctrl-C exits 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from follow_fixtures import WriterProcess

import tracer
from tracer.cli import main
from tracer.cli.errors import EXIT_INTERRUPTED, EXIT_USAGE
from tracer.storage.files import ends_closed

SCRIPT = str(Path(sys.executable).with_name("rollout-trace"))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Generous wait for subprocesses on a loaded machine (not a timing assertion).
WAIT_S = 60.0


class Lines:
    """A subprocess's stdout, collected by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, count: int) -> list[str]:
        deadline = time.monotonic() + WAIT_S
        while len(self.lines) < count and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        assert len(self.lines) >= count, f"got {self.lines}"
        return self.lines


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "tests")])}


def _tail(run_dir: str, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [SCRIPT, "tail", run_dir, "--interval", "0.1", "--grace", "1", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )


def _interrupt(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=WAIT_S)


@pytest.mark.slow  # four interpreters start (tail, two writers): several seconds each on a loaded 2-core machine
def test_tail_prints_each_step_once_in_order_across_writers(tmp_path: Path) -> None:
    """Two workers write steps 1-3 interleaved; tail prints steps 1, 2, 3 once each with both workers' rollouts."""
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    tail = _tail(run_dir)
    out = Lines(tail)
    a, b = WriterProcess(run_dir, "a"), WriterProcess(run_dir, "b")
    for proc, step in ((a, 1), (a, 2), (b, 1), (b, 2), (a, 3), (b, 3)):
        proc.say(f"step {step} 2")
    for proc in (a, b):
        proc.close()
    lines = out.wait_for(3)
    time.sleep(0.5)  # a duplicate would show up within a few more polls
    assert _interrupt(tail) == EXIT_INTERRUPTED
    assert [line.split(":")[0] for line in out.lines] == [f"rollout-trace step {s}" for s in (1, 2, 3)]
    assert all("| 4 trajectories, 0 failed |" in line for line in lines)
    assert "reward 0.5 ± 0.5" in lines[0]


@pytest.mark.slow  # two interpreters start (tail, a writer)
def test_tail_trajectories_prints_one_line_per_finished_trajectory(tmp_path: Path) -> None:
    """--trajectories: key=value fields per finished trajectory; one still running (no root) gets no line."""
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    tail = _tail(run_dir, "--trajectories")
    out = Lines(tail)
    w = WriterProcess(run_dir, "w")
    w.say("open 1")
    w.say("step 1 2")
    lines = out.wait_for(2)
    w.close()
    time.sleep(0.5)
    assert _interrupt(tail) == EXIT_INTERRUPTED
    assert len(out.lines) == 2
    first = dict(field.split("=", 1) for field in lines[0].split(" "))
    assert {
        k: first[k] for k in ("step", "sample", "rollout", "split", "reward", "turns", "tool_errors", "status")
    } == {
        "step": "1",
        "sample": "0",
        "rollout": "0",
        "split": "train",
        "reward": "0",
        "turns": "2",
        "tool_errors": "1",
        "status": "ok",
    }
    assert float(first["latency_s"]) > 0 and first["trace_id"] == "w-s1-p0-r0"
    assert lines[1].startswith("step=1 sample=0 rollout=1 split=train reward=1 ")


@pytest.mark.slow  # two interpreters start (tail, a writer)
def test_tail_prints_the_last_step_of_a_killed_writer(tmp_path: Path) -> None:
    """A writer killed after its last step (no footer, as a Ray actor at ray.shutdown): tail seals it and prints that step."""
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    tail = _tail(run_dir)
    out = Lines(tail)
    w = WriterProcess(run_dir, "w")
    w.say("step 1 2")
    w.say("step 2 2")
    w.kill()
    lines = out.wait_for(2)
    assert _interrupt(tail) == EXIT_INTERRUPTED
    assert [line.split(":")[0] for line in lines] == ["rollout-trace step 1", "rollout-trace step 2"]
    assert [ends_closed(f) for f in tracer.list_trace_files(run_dir)] == [True]  # sealed by tail's reads


def test_tail_of_a_missing_path_says_so_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A path that does not exist: one error line naming it, exit status 2."""
    assert main(["tail", str(tmp_path / "nope")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "does not exist" in err and "nope" in err
