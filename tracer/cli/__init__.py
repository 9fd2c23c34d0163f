"""The ``rollout-trace`` command line.

Subcommands come from the packages that own them, through the entry-point
group ``rollout_trace.commands`` (see pyproject.toml): each entry point is a
function ``register(subparsers)`` that adds one parser and sets its
``func(args) -> int``. ``info`` is tracer's own.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "rollout_trace.commands"


def _info(args: argparse.Namespace) -> int:
    from tracer import TraceFileWarning, list_trace_files, read_trajectories

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceFileWarning)
        try:
            files = list_trace_files(args.path)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        table = read_trajectories(args.path)
    steps = sorted({s for s in table["step"].to_pylist() if s is not None})
    span = f"steps {steps[0]}-{steps[-1]} ({len(steps)})" if steps else "no steps"
    print(f"{args.path}: {len(files)} file(s), {table.num_rows} trajectories, {span}")
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return 0


def _check(args: argparse.Namespace) -> int:
    import json

    from tracer.storage.check import check_path, format_report, summary_dict

    try:
        report = check_path(args.path, repair=args.repair)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary_dict(report), indent=2) if args.json else format_report(report, args.path))
    return 0 if report.ok or args.repair else 1


def _compact(args: argparse.Namespace) -> int:
    from tracer.storage.compact import compact

    try:
        report = compact(args.path, target_bytes=int(args.target_mb * 1024 * 1024))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"compacted {report.files_in} file(s) in {report.run_dirs} run dir(s) into {report.files_out}: "
        f"{report.rows} span(s), {report.bytes_in / 1e6:.1f} MB -> {report.bytes_out / 1e6:.1f} MB"
    )
    for path in report.skipped_open:
        print(f"skipped (still open or torn; see `rollout-trace check`): {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollout-trace", description="Record, view and export agentic RL rollouts.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="summarise the trace files under PATH")
    info.add_argument("path")
    info.set_defaults(func=_info)
    check = sub.add_parser(
        "check",
        help="validate trace files (schema, batches, span tree, duplicates); exit 1 on damage",
        description="Validate every trace file under PATH. Exit status 1 when a file is damaged or spans are duplicated.",
    )
    check.add_argument("path")
    check.add_argument(
        "--repair", action="store_true", help="rewrite readable data of damaged files; originals kept as *.damaged"
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=_check)
    comp = sub.add_parser(
        "compact",
        help="merge closed shard files into large step-indexed files (originals removed once the merge is durable)",
    )
    comp.add_argument("path", help="a run directory or a tree of them")
    comp.add_argument("--target-mb", type=float, default=256.0, help="size of compacted files (default 256)")
    comp.set_defaults(func=_compact)
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as exc:
            broken = sub.add_parser(ep.name, help=f"(unavailable: {exc})")
            broken.set_defaults(func=_unavailable(ep.name, exc))
            continue
        register(sub)
    return parser


def _unavailable(name: str, exc: ImportError) -> object:
    def run(args: argparse.Namespace) -> int:
        print(
            f"error: '{name}' needs a package that is not installed ({exc}); pip install 'rollout-trace[all]'",
            file=sys.stderr,
        )
        return 2

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
