"""``rollout-trace compact``: merge closed shard files into large step-indexed files."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracer import schema as S
from tracer.cli.errors import describe_error
from tracer.read import list_trace_files
from tracer.storage.compact import compact, write_parquet
from tracer.storage.seal import ENV_SEAL_AFTER_S


def register_compact(subparsers: Any) -> None:
    """Add ``rollout-trace compact PATH [--target-mb N] [--seal-after S] [--format ipc|parquet] [--out DIR]``."""
    comp = subparsers.add_parser(
        "compact",
        help="merge closed shard files into large step-indexed files (originals removed once the merge is durable)",
    )
    comp.add_argument("path", help="a run directory or a tree of them")
    comp.add_argument("--target-mb", type=float, default=256.0, help="size of compacted files (default 256)")
    comp.add_argument(
        "--seal-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"seal shards written on other hosts once unchanged this long (default ${ENV_SEAL_AFTER_S} or 6 h); "
        "shards of this host are sealed as soon as their writer is gone",
    )
    comp.add_argument(
        "--format",
        choices=["ipc", "parquet"],
        default="ipc",
        help="ipc (default): merge shards in place; parquet: then also write a step-partitioned zstd "
        "Parquet dataset (for Spark, Ray Data, DuckDB's read_parquet, datasets)",
    )
    comp.add_argument(
        "--out", default=None, help="with --format parquet: the dataset's directory (default PATH/parquet)"
    )
    comp.set_defaults(func=run_compact)


def run_compact(args: argparse.Namespace) -> int:
    """Compact ``args.path`` and print what was merged and what was left alone."""
    try:
        report = compact(args.path, target_bytes=int(args.target_mb * 1024 * 1024), seal_after_s=args.seal_after)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a read-only folder: nothing was deleted that was not merged
        print(f"error: compaction stopped, the original files are kept: {describe_error(exc)}", file=sys.stderr)
        return 2
    print(
        f"compacted {report.files_in} file(s) in {report.run_dirs} run dir(s) into {report.files_out}: "
        f"{report.rows} span(s), {report.bytes_in / 1e6:.1f} MB -> {report.bytes_out / 1e6:.1f} MB"
    )
    for path in report.sealed:
        print(f"sealed (its writer was gone without closing it; every flushed batch kept): {path}")
    for path in report.skipped_open:
        print(f"skipped (still open; compact again once its writer has closed it): {path}")
    for path, why in report.set_aside:
        print(f"set aside, left as it is ({why}): {path}")
    if report.deferred:
        print(
            f"{report.deferred} replaced file(s) kept while readers held their directory "
            "(hidden from readers; the next compact deletes them)"
        )
    if args.format == "parquet":
        try:
            out, rows = write_parquet(args.path, args.out)
        except (FileNotFoundError, OSError) as exc:
            print(f"error: writing Parquet failed: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {rows} span(s) as a step-partitioned Parquet dataset: {out}")
    nothing = report.files_in == 0 and not (report.sealed or report.skipped_open or report.set_aside)
    if nothing and not list_trace_files(args.path):
        print(f"error: no trace files (*{S.FILE_SUFFIX}) under {args.path!r}; give a run directory", file=sys.stderr)
        return 2
    return 0
