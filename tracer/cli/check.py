"""``rollout-trace check``: validate trace files; ``--repair`` fixes the damaged ones."""

from __future__ import annotations

import argparse
import json
import warnings
from typing import Any

from tracer.cli.errors import fail, no_trace_files
from tracer.cli.terminal import terminal_text
from tracer.index.readers import read_trajectories
from tracer.questions import describe_repeats, repeated_keys
from tracer.read import TraceFileWarning, list_trace_files
from tracer.storage.check import check_path, format_report, summary_dict


def register_check(subparsers: Any) -> None:
    check = subparsers.add_parser(
        "check",
        help="validate trace files (schema, batches, span tree, duplicates); exit 1 on damage",
        description="Validate every trace file under PATH. Exit status 1 when a file is damaged or spans are duplicated.",
    )
    check.add_argument("path")
    check.add_argument(
        "--repair", action="store_true", help="rewrite readable data of damaged files; originals kept as *.damaged"
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=run_check, run_paths=("path",))


def run_check(args: argparse.Namespace) -> int:
    """Check (and with ``--repair`` repair) ``args.path``; 0 when OK or repaired, 1 on damage, 2 on a bad path."""
    try:
        report = check_path(args.path, repair=args.repair)
    except FileNotFoundError as exc:
        return fail(str(exc))
    files = list_trace_files(args.path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceFileWarning)  # the report names the damage
        repeats = describe_repeats(repeated_keys(read_trajectories(args.path))) if files else ""
    if args.json:
        print(json.dumps({**summary_dict(report), "repeated_keys": repeats}, indent=2))
    else:
        print("\n".join(terminal_text(line) for line in format_report(report, args.path).splitlines()))
        if repeats:
            print(terminal_text(f"note: {repeats}"))
    if not files:
        return no_trace_files(args.path)
    return 0 if report.ok or args.repair else 1
