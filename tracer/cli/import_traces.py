"""``rollout-trace import mlflow --tracking-uri URI --experiment NAME --out DIR``."""

from __future__ import annotations

import argparse
from typing import Any

from tracer.cli.errors import EXIT_PROBLEM, error_text, fail, show_progress


def register_import(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "import",
        help="read traces from another platform (MLflow) back into trace files",
        description="Read MLflow traces (exported by rollout-trace or any MLflow traces with spans) "
        "into zstd Arrow trace files, keeping times, span tree, attributes and rewards.",
    )
    parser.add_argument("source", choices=["mlflow"], help="platform to read from")
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db)"
    )
    parser.add_argument("--experiment", required=True, help="MLflow experiment name to read")
    parser.add_argument(
        "--out", required=True, help="folder to write trace files under (<out>/<project>/<experiment>/)"
    )
    parser.add_argument("--filter", help="MLflow trace filter, e.g. \"tags.step = '3'\"")
    parser.add_argument("--no-progress", action="store_true", help="do not print progress")
    parser.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    try:
        from tracer.exporters.mlflow import resolve_tracking_uri
        from tracer.exporters.mlflow.importer import import_traces

        uri = resolve_tracking_uri(args.tracking_uri)
        progress = show_progress(not args.no_progress)
        report = import_traces(uri, args.experiment, args.out, progress=progress, filter_string=args.filter)
    except (ImportError, ValueError, OSError) as exc:  # no mlflow, no such experiment, bad URI, server down
        return fail(error_text(exc, "import"), "import")
    for line in report.details:
        print(line)
    return EXIT_PROBLEM if report.refused else 0
