"""``rollout-trace compact``: merge closed shard files into large step-indexed files."""

from __future__ import annotations

import argparse
from typing import Any

from tracer.cli.errors import describe_error, error_text, fail, no_trace_files
from tracer.read import list_trace_files
from tracer.storage import uri as _uri
from tracer.storage.compact import REMOTE_DELETE_AFTER_S, compact, describe_store_error, write_parquet
from tracer.storage.compact_ray import compact_ray, write_parquet_ray
from tracer.storage.seal import ENV_SEAL_AFTER_S

COMPACT_EXAMPLES = """examples:
  rollout-trace compact rollout_traces/gsm8k/grpo-1
  rollout-trace compact rollout_traces --format parquet          # also a Parquet dataset in rollout_traces/parquet
  rollout-trace compact s3://my-bucket/traces/gsm8k --ray --ray-address 10.0.0.5:6379
"""


def register_compact(subparsers: Any) -> None:
    comp = subparsers.add_parser(
        "compact",
        help="merge closed shard files into large step-indexed files (originals removed once the merge is durable)",
        description="Merge the closed shard files of each run under PATH into large files ordered by step, with "
        "their indexes; the originals are removed once the merged file is durable.",
        epilog=COMPACT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    comp.add_argument("path", help="a run directory or a tree of them, or a URI (s3://bucket/prefix)")
    comp.add_argument("--target-mb", type=float, default=256.0, help="size of compacted files (default 256)")
    comp.add_argument(
        "--seal-after",
        type=float,
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
    comp.add_argument("--out", help="with --format parquet: the dataset's directory (default PATH/parquet)")
    comp.add_argument(
        "--ray",
        action="store_true",
        help="run the merges as Ray tasks, one per ~--target-mb of input (workers must reach PATH: "
        "the same bucket and AWS_* settings, or a shared filesystem)",
    )
    comp.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="with --ray: the cluster's head node (default $RAY_ADDRESS, else join or start one on this machine)",
    )
    comp.add_argument(
        "--delete-after",
        type=float,
        metavar="SECONDS",
        help="on object stores (no locks): delete replaced originals once hidden this long, so readers that "
        f"listed them can still open them (default {REMOTE_DELETE_AFTER_S:g}; younger ones go at the next compact)",
    )
    comp.set_defaults(func=run_compact, run_paths=("path",))


def run_compact(args: argparse.Namespace) -> int:
    """Compact ``args.path`` and print what was merged and what was left alone."""
    ray: dict[str, Any] = {"address": args.ray_address} if args.ray else {}
    merge, to_parquet = (compact_ray, write_parquet_ray) if args.ray else (compact, write_parquet)
    try:
        report = merge(
            args.path,
            target_bytes=int(args.target_mb * 1024 * 1024),
            seal_after_s=args.seal_after,
            delete_after_s=args.delete_after,
            **ray,
        )
    except (FileNotFoundError, ValueError, ImportError, ConnectionError) as exc:
        return fail(error_text(exc, "compact"))
    except OSError as exc:  # a full disk, a read-only folder: nothing was deleted that was not merged
        return fail(f"compaction stopped, the original files are kept: {_describe(args.path, exc)}")
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
    for run_dir, why in report.failed:
        print(f"not merged, its files are kept and read as before (compact again to retry): {run_dir}: {why}")
    if args.format == "parquet":
        try:
            out, rows = to_parquet(args.path, args.out, **ray)
        except (FileNotFoundError, OSError) as exc:
            return fail(f"writing Parquet failed: {_describe(args.path, exc)}")
        print(f"wrote {rows} span(s) as a step-partitioned Parquet dataset: {out}")
    nothing = report.files_in == 0 and not (report.sealed or report.skipped_open or report.set_aside or report.failed)
    if nothing and not list_trace_files(args.path):
        return no_trace_files(args.path, "a run directory")
    return 1 if report.failed else 0


def _describe(path: str, exc: OSError) -> str:
    return describe_store_error(path, exc) if _uri.is_remote(path) else describe_error(exc)
