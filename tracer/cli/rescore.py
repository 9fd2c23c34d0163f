"""``rollout-trace rescore RUN --reward module:function``: re-score a run, keeping the original rewards."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from tracer.cli.errors import EXIT_USAGE, fail
from tracer.data.rescore import RescoreError, rescore


def register_rescore(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rescore",
        help="recompute every trajectory's reward with a function; the original rewards are kept",
        description="Calls FUNCTION(messages, response, info) on every recorded trajectory and appends its "
        "rewards to the run as log_reward rows naming their source. Readers then report the new reward; "
        "tracer.read_rewards(RUN) lists every source.",
    )
    p.add_argument("path", help="the run's trace directory (rollout_traces/PROJECT/EXPERIMENT)")
    p.add_argument("--reward", required=True, metavar="MODULE:FUNCTION", help="the reward function to run")
    p.add_argument("--step", dest="steps", type=int, action="append", metavar="N", help="only step N")
    p.set_defaults(func=run_rescore, run_paths=("path",))


def _fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.4f}"


def run_rescore(args: argparse.Namespace) -> int:
    try:
        report = rescore(args.path, args.reward, steps=args.steps)
    except (RescoreError, FileNotFoundError) as exc:
        return fail(str(exc), "rescore")
    except Exception as exc:  # the user's reward function failed: say where, no traceback
        print(f"rollout-trace rescore: {args.reward} raised {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE  # bad input, as for a bad path
    print(
        f"rescored {report.trajectories} trajectories with {report.source}: {report.changed} rewards changed; "
        f"mean reward {_fmt(report.mean_before)} -> {_fmt(report.mean_after)}"
        + (f"; {report.unscored} left as they were (the function returned None)" if report.unscored else "")
    )
    if report.path:
        print(f"  new rewards in {report.path}")
    return 0
