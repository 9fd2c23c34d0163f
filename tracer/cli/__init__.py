"""The ``rollout-trace`` command line: subcommands are ``register(subparsers)`` entry points of
``rollout_trace.commands`` adding parsers with ``func(args) -> int`` and ``run_paths`` (missing local ones are
refused here); exit statuses in :mod:`tracer.cli.errors`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from tracer.cli import errors
from tracer.cli.check import register_check
from tracer.cli.compact import register_compact
from tracer.cli.diff import register_diff
from tracer.cli.info import register_info
from tracer.cli.tail import register_tail
from tracer.extras import install_command

ENTRY_POINT_GROUP = "rollout_trace.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollout-trace", description="Record, view and export agentic RL rollouts.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register_builtin in (register_info, register_check, register_compact, register_diff, register_tail):
        register_builtin(sub)
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as exc:
            missing = errors.missing_package(exc, ep.name)
            text = missing or f"needs a package that is not installed ({exc}); {install_command('all')}"
            broken = sub.add_parser(ep.name, help=f"(unavailable: {missing or exc})")
            broken.set_defaults(func=lambda args, text=text, name=ep.name: errors.fail(text, name))
            continue
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return errors.EXIT_USAGE
    for given in (getattr(args, dest, None) for dest in getattr(args, "run_paths", ())):
        problem = None if given is None else errors.missing_run_path(given)
        if problem is not None:
            return errors.fail(problem, args.command)
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print(f"rollout-trace {args.command}: interrupted", file=sys.stderr)
        return errors.EXIT_INTERRUPTED
    except Exception as exc:  # no traceback for the user: one line naming what failed
        if os.environ.get(errors.ENV_DEBUG) == "1":
            raise
        return errors.fail(
            f"{errors.describe_error(exc, args.command)} (set {errors.ENV_DEBUG}=1 for the traceback)", args.command
        )


if __name__ == "__main__":
    sys.exit(main())
