"""``rollout-trace tail RUN``: follow a run (:class:`tracer.follow.RunFollower`) every ``--interval`` seconds
until Ctrl-C (exit 130). A step's line (:func:`tracer.exporters.console.format_step_line`) is printed once, in
order, when a later step has been in the files for ``--grace`` seconds and every open shard has moved past the
step or stood still that long (all shards closed: the last step too). ``--trajectories``: a line per trajectory,
``--grace`` seconds after its root."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S
from tracer.cli.terminal import terminal_text
from tracer.exporters.console import format_step_line
from tracer.follow import RunFollower
from tracer.summary import step_metrics

#: Seconds between two looks at the files.
DEFAULT_INTERVAL_S = 1.0
#: Seconds a step (or trajectory) must have been quiet before its line is printed.
DEFAULT_GRACE_S = 5.0

TAIL_EXAMPLES = """examples:
  rollout-trace tail rollout_traces/gsm8k/grpo-1                  # one line per finished step
  rollout-trace tail rollout_traces/gsm8k/grpo-1 --trajectories   # one line per finished trajectory
  rollout-trace tail RUN --trajectories | grep 'tool_errors=[1-9]'
"""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; give e.g. 1 or 0.5") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds > 0, e.g. 1")
    return value


def register_tail(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tail",
        help="follow a run while it trains: one line per finished step or trajectory, until Ctrl-C",
        description="Print one summary line per finished step of the run (or per finished trajectory), "
        "following new batches, new files and new shards of every worker until interrupted (exit status 130).",
        epilog=TAIL_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="the run's trace folder (or a trace file)")
    p.add_argument(
        "--trajectories",
        action="store_true",
        help="one line per finished trajectory: step, sample, rollout, reward, turns, tool errors, latency",
    )
    p.add_argument(
        "--interval",
        type=_seconds,
        default=DEFAULT_INTERVAL_S,
        help=f"seconds between looks at the files (default {DEFAULT_INTERVAL_S:g})",
    )
    p.add_argument(
        "--grace",
        type=_seconds,
        default=DEFAULT_GRACE_S,
        help=f"seconds a step or trajectory must be quiet before it counts as finished (default {DEFAULT_GRACE_S:g}; "
        "at least the writers' flush_interval_s)",
    )
    p.set_defaults(func=run_tail, run_paths=("path",))


def _num(value: Any) -> str:
    """A field's value: numbers short, text quoted (logfmt) when it holds a space, ``=`` or a quote."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    if not text or any(c.isspace() or c in "=\"'\\" for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


def trajectory_line(row: dict[str, Any]) -> str:
    """The ``--trajectories`` line of one summary row: ``key=value`` fields, easy to grep and split."""
    start, end = row[S.START_NS], row[S.END_NS]
    latency = (end - start) / 1e9 if start is not None and end is not None else None
    fields = [
        ("step", row[S.STEP]),
        ("sample", row[S.SAMPLE_INDEX]),
        ("rollout", row[S.ROLLOUT_N]),
        ("split", "validation" if row[S.VALIDATE] else "train"),
        ("reward", row[S.REWARD]),
        ("turns", row[S.NUM_LLM_CALLS]),
        ("tool_calls", row[S.NUM_TOOL_CALLS]),
        ("tool_errors", row[S.NUM_TOOL_ERRORS]),
        ("latency_s", None if latency is None else round(latency, 3)),
        ("status", row[S.STATUS]),
        ("trace_id", row[S.TRACE_ID]),
    ]
    return " ".join(f"{k}={_num(v)}" for k, v in fields)


class Tail:
    """What ``tail`` has printed and what it waits for; :meth:`lines` after each poll."""

    def __init__(self, follower: RunFollower, trajectories: bool, grace: float) -> None:
        self.follower = follower
        self.trajectories = trajectories
        self.grace = grace
        self.printed_steps: set[int | None] = set()
        #: Trajectories whose line is printed or due (each printed once, even if later rows change it).
        self.printed: set[str] = set()
        self.candidates: set[str] = set()
        self.step_seen: dict[int, float] = {}
        self.root_seen: dict[str, float] = {}

    def lines(self, now: float | None = None) -> list[str]:
        """The lines due now, in order, each one terminal line (:func:`tracer.cli.terminal.terminal_text`)."""
        now = time.monotonic() if now is None else now
        for step in self.follower.steps():
            self.step_seen.setdefault(step, now)
        due = self._trajectory_lines(now) if self.trajectories else self._step_lines(now)
        return [terminal_text(line) for line in due]

    def _finished(self, step: int, now: float) -> bool:
        later = [t for s, t in self.step_seen.items() if s > step]
        files = self.follower.files.values()
        settled = now - min(later) >= self.grace if later else all(f.closed for f in files)
        return settled and all(
            f.closed or (f.max_step is not None and f.max_step > step) or now - f.changed_at >= self.grace
            for f in files
        )

    def _step_lines(self, now: float) -> list[str]:
        out = []
        for step in self.follower.steps():
            if step in self.printed_steps:
                continue
            if not self._finished(step, now):
                break  # steps finish in order: nothing after this one is due either
            self.printed_steps.add(step)
            table = self.follower.trajectories([step])
            done = table.filter(pc.not_equal(table.column(S.STATUS), S.STATUS_INCOMPLETE))
            for (_, validate), metrics in sorted(step_metrics(done).items(), key=lambda kv: bool(kv[0][1])):
                out.append(format_step_line(step, metrics, bool(validate)))
        return out

    def _trajectory_lines(self, now: float) -> list[str]:
        if not self.candidates:
            return []
        table = self.follower.trajectories()
        ids = pa.array(sorted(self.candidates), pa.string())
        table = table.filter(pc.is_in(table.column(S.TRACE_ID), value_set=ids))
        all_closed = all(f.closed for f in self.follower.files.values())
        out = []
        for row in table.to_pylist():
            tid = row[S.TRACE_ID]
            if row[S.STATUS] == S.STATUS_INCOMPLETE:
                continue
            if now - self.root_seen.setdefault(tid, now) >= self.grace or all_closed:
                self.candidates.discard(tid)
                self.root_seen.pop(tid, None)
                out.append(trajectory_line(row))
        return out

    def saw(self, changed: list[str]) -> None:
        """Trajectories a poll (re)summarised: candidates for a line, unless printed already."""
        self.candidates.update(t for t in changed if t not in self.printed)
        self.printed.update(changed)


def run_tail(args: argparse.Namespace) -> int:
    """Follow ``args.path`` until interrupted (KeyboardInterrupt: the CLI answers 130)."""
    follower = RunFollower(args.path)
    tail = Tail(follower, args.trajectories, args.grace)
    said: set[str] = set()  # each warning once
    while True:
        update = follower.poll()
        tail.saw(update.changed)
        notes = [f"warning: {message}" for message in update.warnings]
        if not follower.files:
            notes.append(f"rollout-trace tail: no trace files under {args.path} yet; waiting")
        for note in notes:
            if note not in said:
                said.add(note)
                print(terminal_text(note), file=sys.stderr, flush=True)
        for line in tail.lines():
            print(line, flush=True)
        time.sleep(args.interval)
