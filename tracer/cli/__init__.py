"""The ``rollout-trace`` command line.

Subcommands come from the packages that own them, through the entry-point
group ``rollout_trace.commands`` (see pyproject.toml): each entry point is a
function ``register(subparsers)`` that adds one parser and sets its
``func(args) -> int``. ``info``, ``check``, ``compact`` and ``diff`` are tracer's own
(one module each in this package), always present.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from tracer.cli.check import register_check
from tracer.cli.compact import register_compact
from tracer.cli.diff import register_diff
from tracer.cli.info import register_info
from tracer.extras import install_command

ENTRY_POINT_GROUP = "rollout_trace.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollout-trace", description="Record, view and export agentic RL rollouts.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register_info(sub)
    register_check(sub)
    register_compact(sub)
    register_diff(sub)
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
            f"error: '{name}' needs a package that is not installed ({exc}); {install_command('all')}",
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
