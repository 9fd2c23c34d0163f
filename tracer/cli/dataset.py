"""``rollout-trace dataset RUN --out DIR``: a run's trajectories as a training dataset (:mod:`tracer.data.dataset`)."""

from __future__ import annotations

import argparse
from typing import Any

from tracer.cli.errors import fail
from tracer.data import dataset as ds


def register_dataset(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "dataset",
        help="write recorded trajectories as a training dataset (Parquet or JSONL)",
        description="One row per trajectory (or per model turn): messages in OpenAI chat format, prompt_ids, "
        "response_ids, response_mask (1 = model token), logprobs, reward, advantage and the trajectory's keys. "
        "Writes DIR/train.<format> and DIR/validation.<format>.",
    )
    p.add_argument("path", help="a trace file or a run's directory (rollout_traces/PROJECT/EXPERIMENT)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the files into")
    p.add_argument("--steps", metavar="SPEC", help="steps to include: N, N,M, N-M, N- or last:K")
    p.add_argument("--split", choices=ds.SPLIT_CHOICES, help="only training or validation trajectories")
    p.add_argument(
        "--filter",
        dest="filters",
        action="append",
        default=[],
        metavar="EXPR",
        help="keep trajectories where EXPR holds (repeatable, all must hold): reward>=1, status==ok, turns<=3",
    )
    p.add_argument(
        "--per", choices=ds.PER_CHOICES, default=ds.PER_TRAJECTORY, help="one row per trajectory or per turn"
    )
    p.add_argument("--format", choices=ds.FORMAT_CHOICES, default=ds.FORMAT_PARQUET, help="file format")
    p.set_defaults(func=run_dataset, run_paths=("path",))


def run_dataset(args: argparse.Namespace) -> int:
    try:
        tables = ds.iter_dataset(args.path, steps=args.steps, split=args.split, filters=args.filters, per=args.per)
        counts = ds.write_dataset(tables, args.out, args.format)
    except (ds.DatasetOptionError, FileNotFoundError) as exc:
        return fail(str(exc), "dataset")
    if not counts:
        print(f"no rows: no trajectory of {args.path} matched; nothing written to {args.out}")
        return 0
    for name, n in counts.items():
        print(f"{n} rows -> {name}")
    return 0
