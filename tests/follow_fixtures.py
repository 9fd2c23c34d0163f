"""Helpers of the follow tests: trajectories as span rows, written batch by batch through the storage writer.

Also runnable as a writer process: ``python tests/follow_fixtures.py RUN_DIR [WORKER]``
reads commands from stdin, one a line: ``step N [ROLLOUTS]`` writes step N's
finished trajectories, ``open N`` the first span of a trajectory of step N
whose root has not ended, ``quit`` closes the file; each command is answered
``ok`` once its batch is on disk.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pyarrow as pa

from tracer import schema as S
from tracer.index.closed import shard_closed
from tracer.storage.writer import SpanWriter

META = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION}
#: Where a wall-clock-like start time begins (ns); each step adds STEP_NS.
T0_NS = 1_700_000_000_000_000_000
STEP_NS = 10_000_000_000
#: Time between two spans of a trajectory (ns).
TICK_NS = 100_000_000


def trajectory_rows(
    step: int,
    sample: int,
    rollout: int,
    worker: str = "w",
    tools: int = 1,
    reward: float | None = 1.0,
    root: bool = True,
    tool_error: bool = False,
    start_ns: int | None = None,
) -> list[dict[str, Any]]:
    """Span rows of one trajectory: llm and tool children, the root (when ``root``), a log_reward row."""
    tid = f"{worker}-s{step}-p{sample}-r{rollout}"
    t0 = T0_NS + step * STEP_NS + (sample * 10 + rollout) * 1_000_000 if start_ns is None else start_ns
    common = {S.TRACE_ID: tid, S.STEP: step, S.SAMPLE_INDEX: str(sample), S.ROLLOUT_N: rollout, S.VALIDATE: False}
    rows: list[dict[str, Any]] = []
    t = t0 + TICK_NS
    for i in range(tools + 1):
        rows.append(
            {**common, S.SPAN_ID: f"{tid}-l{i}", S.PARENT_SPAN_ID: f"{tid}-root", S.NAME: "generate"}
            | {S.KIND: S.KIND_LLM, S.STATUS: S.STATUS_OK, S.START_NS: t, S.END_NS: t + TICK_NS // 2}
        )
        t += TICK_NS
        if i < tools:
            status = S.STATUS_ERROR if tool_error and i == 0 else S.STATUS_OK
            rows.append(
                {**common, S.SPAN_ID: f"{tid}-t{i}", S.PARENT_SPAN_ID: f"{tid}-root", S.NAME: "calculator"}
                | {S.KIND: S.KIND_TOOL, S.STATUS: status, S.START_NS: t, S.END_NS: t + TICK_NS // 3}
            )
            t += TICK_NS
    if root:
        rows.append(
            {**common, S.SPAN_ID: f"{tid}-root", S.PARENT_SPAN_ID: None, S.NAME: "agent_loop"}
            | {S.KIND: S.KIND_ROLLOUT, S.STATUS: S.STATUS_OK, S.START_NS: t0, S.END_NS: t + TICK_NS // 10}
        )
        if reward is not None:
            rows.append(
                {**common, S.SPAN_ID: f"{tid}-reward", S.PARENT_SPAN_ID: None, S.NAME: S.REWARD_SPAN_NAME}
                | {
                    S.KIND: S.KIND_REWARD,
                    S.STATUS: S.STATUS_OK,
                    S.START_NS: t + TICK_NS // 5,
                    S.END_NS: t + TICK_NS // 5,
                }
                | {S.REWARD: reward, S.ATTRIBUTES: '{"advantage": 0.5}'}
            )
    return rows


def batch_of(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Rows as one record batch of the span schema."""
    return pa.RecordBatch.from_pylist(rows, schema=S.SPAN_SCHEMA)


def writer(run_dir: str | os.PathLike[str], **kwargs: Any) -> SpanWriter:
    """The storage writer, as a worker's recorder would open it."""
    return SpanWriter(os.fspath(run_dir), META, on_close=shard_closed, **kwargs)


def step_rows(step: int, rollouts: int, worker: str = "w") -> list[dict[str, Any]]:
    """Every finished trajectory of one step of one worker: ``rollouts`` rollouts of one prompt."""
    rows: list[dict[str, Any]] = []
    for r in range(rollouts):
        rows += trajectory_rows(step, 0, r, worker, reward=float(r % 2), tool_error=r == 0)
    return rows


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Generous wait for the writer process on a loaded machine (not a timing assertion).
WAIT_S = 120


class WriterProcess:
    """This module run as a writer process: one command a line, answered once its batch is on disk."""

    def __init__(self, run_dir: str, worker: str = "w") -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "tests")])}
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), run_dir, worker],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def say(self, command: str, answer: str = "ok") -> None:
        """Send one command and wait for its answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        got = self.proc.stdout.readline().strip()
        assert got == answer, f"writer answered {got!r} to {command!r}"

    def kill(self) -> None:
        """End the writer with SIGKILL: its file stays as it was, with no footer."""
        self.proc.kill()
        self.proc.wait(timeout=WAIT_S)

    def close(self) -> None:
        """Close the writer's file (its footer) and wait for the process to end."""
        if self.proc.poll() is None:
            self.say("quit", "closed")
        self.proc.wait(timeout=WAIT_S)


def _serve(run_dir: str, worker: str) -> None:
    w = writer(run_dir)
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "quit":
            break
        step = int(parts[1])
        if parts[0] == "step":
            w.write(batch_of(step_rows(step, int(parts[2]) if len(parts) > 2 else 2, worker)))
        elif parts[0] == "open":
            rows = trajectory_rows(step, 9, 0, worker, tools=0, root=False)
            w.write(batch_of(rows))
        print("ok", flush=True)
    w.close()
    print("closed", flush=True)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "w")
