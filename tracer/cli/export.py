"""``rollout-trace export PATH --to BACKEND``: post-hoc export of trace files (:func:`tracer.exporters.export_files`)
with flags built from the backends' options (:data:`tracer.backends.BACKENDS`), plus ``--opt NAME=VALUE``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracer.backends import BACKENDS, ExportOptionError, Option, get_backend
from tracer.cli.errors import EXIT_PROBLEM, EXIT_USAGE, describe_error, error_text, fail, show_progress
from tracer.exporters.base import export_files


def _backend_options() -> dict[str, list[tuple[str, Option]]]:
    """Option name -> the backends that have it, with their declarations."""
    out: dict[str, list[tuple[str, Option]]] = {}
    for backend in BACKENDS.values():
        for option in backend.options:
            out.setdefault(option.name, []).append((backend.name, option))
    return out


def register_export(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "export",
        help=f"export trace files to a tracking backend ({', '.join(BACKENDS)})",
        description="Export recorded trajectories from trace files to a tracking backend. "
        + " ".join(f"{b.name}: {b.help}." for b in BACKENDS.values()),
    )
    p.add_argument("path", help="a trace file or a directory of them (e.g. rollout_traces/PROJECT/EXPERIMENT)")
    p.add_argument("--to", required=True, metavar="BACKEND", help=f"one of: {', '.join(BACKENDS)}")
    for name, owners in _backend_options().items():
        first = owners[0][1]
        helps = "; ".join(
            f"{b}: {o.help}" + (f" ({'|'.join(map(str, o.choices))})" if o.choices else "") for b, o in owners
        )
        boolean = first.type is bool
        typed: dict[str, Any] = {"action": argparse.BooleanOptionalAction} if boolean else {"type": first.type}
        p.add_argument(first.cli_flag, dest=name, help=helps, metavar=None if boolean else name.upper(), **typed)
    p.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any option of the backend by its name (repeatable), e.g. --opt max_rows=5000",
    )
    p.add_argument(
        "--step", dest="steps", type=int, action="append", metavar="N", help="export only step N (repeatable)"
    )
    p.add_argument("--since-step", type=int, metavar="N", help="export only steps >= this")
    p.add_argument(
        "--log-val-generations",
        type=int,
        metavar="N",
        help="validation rows per step in tables (default: the recorded config's)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="read the backend back and compare rows, rewards and metrics with the files",
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=run_export, run_paths=("path",))


def _options(args: argparse.Namespace, target: str) -> dict[str, Any]:
    """The backend options given as flags or ``--opt``; raises ExportOptionError for one that does not apply."""
    backend = get_backend(target)
    options: dict[str, Any] = {}
    for name, owners in _backend_options().items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if backend.option(name) is None:
            users = ", ".join(b for b, _ in owners)
            raise ExportOptionError(f"{owners[0][1].cli_flag} does not apply to {target}; it is for {users}")
        options[name] = value
    for item in args.opt:
        key, sep, value = item.partition("=")
        if not sep:
            raise ExportOptionError(f"--opt {item!r} is not NAME=VALUE")
        options[key.strip()] = value
    return options


def run_export(args: argparse.Namespace) -> int:
    target = str(args.to).lower()
    try:
        options = _options(args, target)
        report = export_files(
            args.path,
            target,
            steps=args.steps,
            since_step=args.since_step,
            progress=show_progress(args.progress) and target != "console",  # the console's lines own the terminal
            verify=args.verify,
            log_val_generations=args.log_val_generations,
            **options,
        )
    except (ImportError, FileNotFoundError, ValueError) as exc:  # ExportOptionError is a ValueError
        return fail(error_text(exc, "export"), "export")
    except Exception as exc:  # the backend's own failure (no login, server down): say it, no traceback
        print(f"rollout-trace export: {target} failed: {describe_error(exc)}", file=sys.stderr)
        return EXIT_USAGE  # the environment, as for bad input
    print(
        f"{report.backend}: sent {report.trajectories_sent} trajectories"
        + (f" ({report.spans_sent} spans)" if report.spans_sent else "")
        + f", skipped {report.trajectories_skipped}"
        + (f", caught up {report.caught_up} the destination lacked" if report.caught_up else "")
    )
    for line in report.details:
        print(f"  {line}")
    if not (report.trajectories_sent or report.trajectories_skipped or report.trajectories_refused):
        return fail(
            f"no readable trajectory under {args.path!r} (see the warnings above); nothing was exported", "export"
        )
    if report.verify is not None and not report.verify.ok:
        return EXIT_PROBLEM
    for line in report.problems:
        print(f"rollout-trace export: {line}", file=sys.stderr)
    if report.trajectories_refused:
        print(
            f"rollout-trace export: {report.trajectories_refused} trajectories refused by {target} (named above); "
            "the others were sent",
            file=sys.stderr,
        )
    return 0 if report.complete else EXIT_PROBLEM
