"""``rollout-trace info``: summarise the trace files under a path."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from tracer import schema as S
from tracer.cli.errors import fail, missing_run_path, no_trace_files
from tracer.cli.terminal import terminal_text
from tracer.exporters.lag import read_lag
from tracer.index.readers import read_trajectories
from tracer.questions import describe_repeats, repeated_keys
from tracer.read import TraceFileWarning, list_trace_files


def register_info(subparsers: Any) -> None:
    info = subparsers.add_parser(
        "info",
        help="summarise the trace files under PATH",
        description="Count the trace files, trajectories and steps under PATH, say how far behind the files each "
        "live exporter is, name (step, sample, rollout) keys held by more than one trajectory, and name every file "
        "that could not be read. Exit status 2 when nothing is readable.",
    )
    info.add_argument("path", help="a trace file or a directory of them (e.g. rollout_traces/PROJECT/EXPERIMENT)")
    info.set_defaults(func=run_info, run_paths=("path",))


def run_info(args: argparse.Namespace) -> int:
    """Print files, trajectories and steps under ``args.path``, then every reader warning; 2 when nothing is readable."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceFileWarning)
        try:
            files = list_trace_files(args.path)
        except FileNotFoundError as exc:
            return fail(missing_run_path(args.path) or str(exc))
        table = read_trajectories(args.path)
    steps = sorted({s for s in table[S.STEP].to_pylist() if s is not None})
    span = f"steps {steps[0]}-{steps[-1]} ({len(steps)})" if steps else "no steps"
    print(terminal_text(f"{args.path}: {len(files)} file(s), {table.num_rows} trajectories, {span}"))
    repeats = describe_repeats(repeated_keys(table))
    if repeats:
        print(terminal_text(f"repeated keys: {repeats}"))
    lag = read_lag(args.path)
    if lag:
        print("live exporters (how far behind the files):")
        for record in lag:
            print(terminal_text(f"  {record.describe()}"))
    for w in caught:
        print(terminal_text(f"warning: {w.message}"), file=sys.stderr)
    if not files:
        return no_trace_files(args.path)
    if table.num_rows == 0 and caught:
        return fail(f"{args.path!r} holds no readable trace (see the warnings above)")
    return 0
