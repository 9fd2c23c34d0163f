"""``rollout-trace export PATH --to BACKEND``: post-hoc export of trace files.

Registered through the ``rollout_trace.commands`` entry point
(``export = "tracer.cli.export:register_export"``). The backend module
``tracer.exporters.<backend>`` is imported only when the command runs; its
``export_files(path, **options)`` does the work and returns an
:class:`~tracer.exporters.ExportReport`, which is printed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

#: Backends ``--to`` accepts, with the options each one's ``export_files`` takes.
TARGETS: dict[str, tuple[str, ...]] = {
    "mlflow": ("tracking_uri", "experiment"),
    "wandb": ("project", "experiment", "mode", "run_dir"),
    "swanlab": ("project", "experiment", "mode", "log_dir"),
    "console": (),
}
#: ``--mode`` values per backend (first: default).
MODES: dict[str, tuple[str, ...]] = {
    "wandb": ("offline", "online"),
    "swanlab": ("local", "offline", "online"),
}
#: Options every backend takes.
COMMON = ("steps", "since_step", "progress", "verify")
#: Exit status for bad input (as argparse uses).
EXIT_USAGE = 2
#: Exit status when the backend fails.
EXIT_FAILED = 1
#: Exit status when ``--verify`` finds a difference.
EXIT_VERIFY_FAILED = 1


def register_export(subparsers: Any) -> None:
    """Add the ``export`` subcommand to ``rollout-trace``."""
    p = subparsers.add_parser(
        "export",
        help="export trace files to MLflow, WandB or SwanLab",
        description="Export recorded trajectories from trace files to a tracking backend.",
    )
    p.add_argument("path", help="a trace file or a directory of them (e.g. rollout_traces/PROJECT/EXPERIMENT)")
    p.add_argument("--to", required=True, metavar="BACKEND", help=f"one of: {', '.join(TARGETS)}")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else a local SQLite file)",
    )
    p.add_argument(
        "--experiment", default=None, help="MLflow experiment / wandb or swanlab run name (default: from the files)"
    )
    p.add_argument(
        "--mode",
        default=None,
        help="wandb: offline|online (default offline); swanlab: local|offline|online (default local)",
    )
    p.add_argument("--project", default=None, help="wandb/swanlab project (default: the recorded project name)")
    p.add_argument("--log-dir", default=None, help="swanlab: directory of the run's files (default ./swanlog)")
    p.add_argument(
        "--dir",
        dest="run_dir",
        default=None,
        help="wandb: parent directory of the run's files (default WANDB_DIR or .)",
    )
    p.add_argument(
        "--step",
        dest="steps",
        type=int,
        action="append",
        default=None,
        metavar="N",
        help="export only step N (repeatable)",
    )
    p.add_argument("--since-step", type=int, default=None, metavar="N", help="export only steps >= N")
    p.add_argument(
        "--verify", action="store_true", help="read the backend back and compare counts and rewards with the files"
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=run_export)


def _error(message: str) -> int:
    print(f"rollout-trace export: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def run_export(args: argparse.Namespace) -> int:
    """Run ``rollout-trace export``; return the exit status."""
    target = str(args.to).lower()
    if target not in TARGETS:
        return _error(f"unknown backend --to {args.to!r}; valid choices are {', '.join(TARGETS)}")
    if not os.path.exists(args.path):
        return _error(f"{args.path!r} does not exist; give a trace file (.arrow) or a directory of them")
    if args.mode is not None:
        modes = MODES.get(target)
        if modes is None:
            return _error(f"--mode does not apply to {target}; it is for {', '.join(MODES)}")
        if args.mode not in modes:
            return _error(f"--mode {args.mode!r} is not valid for {target}; valid modes are {', '.join(modes)}")
    options: dict[str, Any] = {name: getattr(args, name) for name in COMMON}
    for name in TARGETS[target]:
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    if target == "mlflow" and options.get("tracking_uri") is None and os.environ.get("MLFLOW_TRACKING_URI"):
        options["tracking_uri"] = os.environ["MLFLOW_TRACKING_URI"]
    for flag, name in (("--log-dir", "log_dir"), ("--dir", "run_dir"), ("--tracking-uri", "tracking_uri")):
        if getattr(args, name) is not None and name not in TARGETS[target]:
            return _error(f"{flag} does not apply to {target}")
    module_name = f"tracer.exporters.{target}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if getattr(exc, "name", None) == module_name:
            return _error(f"the {target} exporter is not part of this installation ({exc})")
        return _error(str(exc))
    try:
        report = module.export_files(args.path, **options)
    except ImportError as exc:
        return _error(str(exc))
    except FileNotFoundError as exc:
        return _error(str(exc))
    except ValueError as exc:
        return _error(str(exc))
    except Exception as exc:  # the backend's own failure (no login, server down): say it, no traceback
        print(f"rollout-trace export: {target} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"{report.backend}: sent {report.trajectories_sent} trajectories"
        + (f" ({report.spans_sent} spans)" if report.spans_sent else "")
        + f", skipped {report.trajectories_skipped}"
    )
    for line in report.details:
        print(f"  {line}")
    if args.verify and any(
        line.startswith("verify") and ("FAILED" in line or "MISMATCH" in line) for line in report.details
    ):
        return EXIT_VERIFY_FAILED
    return 0
