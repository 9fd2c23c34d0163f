"""The landing page of a 10M-span run, cold: with the run rollup, with shard indexes alone, from trajectory rows.

What the landing page reads of a run is tracer's: its steps and span count (``tracer.read.read_steps``),
whether token stats were logged (``tracer.read.has_spans_named``), and the per-step aggregates with
their value metrics (``tracer.index.readers.read_step_partials(run, value_metrics=True)``, then
``tracer.summary.partial_metrics``). A run of 10M spans (1.25M trajectories of 8 spans, 100 steps) is
laid out as 16 and as 1,000 uncompacted shards, and each page is timed in a fresh Python process
(imports excluded; the OS page cache warm), three ways:

1. ``rollup``: the shards' indexes and the run rollup (``tracer.index.rollup``), as writers leave a run;
2. ``indexes``: the rollup moved aside: every shard's sidecar, its stored per-step counts and its
   sorted value columns (``tracer.index.shard.SORTED_COLUMNS``) merged on each visit;
3. ``rows``: the rollup moved aside and the aggregates computed from every stored trajectory row
   (``step_partials(read_trajectories(run))``): what the page costs without the sorted value columns.

The run is built quickly: the landing page reads only sidecars (and stats the shards), so each shard is
a real closed Arrow file with one one-span batch per step, and its sidecar, written by
``tracer.index.shard.write_shard_index`` from generated trajectory rows, holds the rows of its share of the
10M spans (the shard's batch row counts say so too). Target: every page under 0.3 s, cold.

    python bench/bench_landing.py [--spans 10000000] [--shards 16,1000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from report import write_result  # noqa: E402

from tracer import schema as S  # noqa: E402
from tracer.index import rollup  # noqa: E402
from tracer.index import shard as _si  # noqa: E402
from tracer.index.readers import read_step_partials  # noqa: E402
from tracer.summary import step_partials  # noqa: E402

STEPS = 100
SPANS_PER_TRAJECTORY = 8
TARGET_S = 0.3
RESULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "landing.json")
META = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION}


class _Rows:
    """What :func:`tracer.index.shard.write_shard_index` takes of a builder, over generated trajectory rows."""

    def __init__(self, table: pa.Table, batch_rows: list[int]) -> None:
        self.table = table
        self.batch_rows = batch_rows
        self.batch_steps = [[s] for s in range(STEPS)]
        self.names = {"agent_loop", "generate", "log_token_stats"}
        self.step_partials = step_partials

    def build(self) -> pa.Table:
        return self.table


def _trajectories(shard: int, n: int, rng: np.random.Generator) -> pa.Table:
    """``n`` trajectory rows of one writer, its trace ids a prefix and a counter (disjoint ranges)."""
    counter = pa.array(np.arange(n, dtype=np.int64)).cast(pa.string())
    ids = pc.binary_join_element_wise(f"w{shard:05d}-", pc.utf8_lpad(counter, 10, "0"), "")
    steps = np.repeat(np.arange(STEPS, dtype=np.int64), -(-n // STEPS))[:n]
    start = rng.integers(0, 10**12, n)
    cols: dict[str, Any] = {
        S.TRACE_ID: ids,
        S.NAME: pa.array(["agent_loop"] * n),
        S.STEP: steps,
        S.SAMPLE_INDEX: pc.cast(pa.array(np.arange(n) % 64), pa.string()),
        S.ROLLOUT_N: np.zeros(n, dtype=np.int64),
        S.VALIDATE: np.zeros(n, dtype=bool),
        S.REWARD: rng.random(n),
        S.REWARD_INFO: pa.nulls(n, pa.string()),
        S.STATUS: pa.array([S.STATUS_OK] * n),
        S.START_NS: start,
        S.END_NS: start + rng.integers(10**6, 10**10, n),
        S.NUM_SPANS: np.full(n, SPANS_PER_TRAJECTORY, dtype=np.int64),
        S.NUM_LLM_CALLS: np.full(n, 3, dtype=np.int64),
        S.NUM_TOOL_CALLS: np.full(n, 4, dtype=np.int64),
        S.NUM_TOOL_ERRORS: np.zeros(n, dtype=np.int64),
        S.NUM_ERRORS: np.zeros(n, dtype=np.int64),
    }
    table = pa.table({f.name: pa.array(cols[f.name], f.type) for f in S.TRAJECTORY_SCHEMA}, schema=S.TRAJECTORY_SCHEMA)
    step_col = table.column(S.STEP).combine_chunks().to_numpy()
    extra = {
        S.INDEX_BATCHES: pa.array([[int(s)] for s in step_col], pa.list_(pa.int32())),
        S.INDEX_UNIFORM: pa.array(np.ones(n, dtype=bool)),
        S.INDEX_TRACE_HASH: _si.trace_hashes(table.column(S.TRACE_ID).combine_chunks()),
        S.INDEX_SORTED_REWARDS: pa.nulls(n, pa.float64()),
        S.INDEX_SORTED_LATENCIES: pa.nulls(n, pa.float64()),
    }
    for name, values in extra.items():
        table = table.append_column(_si.INDEX_SCHEMA.field(name), values)
    return table


def build_run(run: str, spans: int, shards: int) -> None:
    """``shards`` closed stand-in shards and their sidecars holding ``spans`` spans' trajectories, and the rollup."""
    os.makedirs(run, exist_ok=True)
    rng = np.random.default_rng(0)
    per_shard = spans // shards
    span = pa.RecordBatch.from_pylist(
        [{S.TRACE_ID: "x", S.SPAN_ID: "x", S.NAME: "agent_loop", S.STEP: 0}], schema=S.SPAN_SCHEMA
    )
    for k in range(shards):
        path = os.path.join(run, f"host_{k + 1}_20260101T000000_{k:08x}_0000{S.FILE_SUFFIX}")
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, S.SPAN_SCHEMA.with_metadata(META)) as w:
            for _ in range(STEPS):
                w.write_batch(span)
        batch_rows = [per_shard // STEPS + (1 if s < per_shard % STEPS else 0) for s in range(STEPS)]
        _si.write_shard_index(path, _Rows(_trajectories(k, per_shard // SPANS_PER_TRAJECTORY, rng), batch_rows))  # type: ignore[arg-type]
    assert rollup.update(run, read_step_partials, wait_s=60.0)


def page(run: str, how: str) -> dict[str, Any]:
    """The landing page's data of ``run``, read ``how``."""
    from tracer.index.readers import read_step_partials, read_trajectories
    from tracer.read import has_spans_named, read_steps
    from tracer.summary import partial_metrics

    steps, rows = read_steps(run)
    stats = has_spans_named(run, "log_token_stats")
    parts = step_partials(read_trajectories(run)) if how == "rows" else read_step_partials(run, value_metrics=True)
    metrics = partial_metrics(parts)
    trajectories = int(pc.sum(parts.column(S.PART_TRAJECTORIES)).as_py())
    return {"steps": len(steps), "rows": rows, "stats": stats, "metrics": len(metrics), "trajectories": trajectories}


def measure(run: str, how: str) -> dict[str, Any]:
    """Time the page in this fresh process: the first (cold) call and a warm one."""
    pa.array([0])
    t0 = time.perf_counter()
    out = page(run, how)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    page(run, how)
    return {**out, "cold": cold, "warm": time.perf_counter() - t0}


def fresh(run: str, how: str) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--measure", how, "--run", run]
    return dict(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]))


def aside(run: str) -> str:
    """Move the rollup out of ``run``; return where it went."""
    where = os.path.join(os.path.dirname(run), os.path.basename(run) + rollup.ROLLUP_NAME)
    os.replace(os.path.join(run, rollup.ROLLUP_NAME), where)
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--shards", default="16,1000")
    parser.add_argument("--dir", default=None, help="build the runs here (kept); default a temporary directory")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.run, args.measure)))
        return
    base = args.dir or tempfile.mkdtemp(prefix="rt-bench-landing-")
    results: dict[int, dict[str, dict[str, Any]]] = {}
    try:
        for shards in [int(s) for s in args.shards.split(",")]:
            run = os.path.join(base, f"run_{args.spans}_{shards}")
            if not os.path.exists(os.path.join(run, rollup.ROLLUP_NAME)):
                shutil.rmtree(run, ignore_errors=True)
                t0 = time.perf_counter()
                build_run(run, args.spans, shards)
                print(f"built {shards} shards of {args.spans:,} spans in {time.perf_counter() - t0:.1f} s")
            got = {"rollup": fresh(run, "rollup")}
            moved = aside(run)
            try:
                got["indexes"] = fresh(run, "indexes")
                got["rows"] = fresh(run, "rows")
            finally:
                os.replace(moved, os.path.join(run, rollup.ROLLUP_NAME))
            answers = {
                k: {f: v[f] for f in ("steps", "rows", "stats", "metrics", "trajectories")} for k, v in got.items()
            }
            assert len({json.dumps(a, sort_keys=True) for a in answers.values()}) == 1, answers
            results[shards] = got
            print(
                f"{shards:>5} shards: "
                + ", ".join(f"{k} {v['cold'] * 1e3:.1f} ms cold ({v['warm'] * 1e3:.1f} warm)" for k, v in got.items())
                + f"; indexes/rollup {got['indexes']['cold'] / got['rollup']['cold']:.1f}x"
            )
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    ms = {n: {k: round(v["cold"] * 1e3, 1) for k, v in r.items()} for n, r in results.items()}
    figure = "; ".join(
        f"{n} shards: rollup {m['rollup']} ms, indexes alone {m['indexes']} ms, from rows {m['rows']} ms"
        for n, m in ms.items()
    )
    alone = all(r["indexes"]["cold"] < TARGET_S for r in results.values())
    figure += (
        "; indexes alone meet the target: the rollup could go"
        if alone
        else "; indexes alone miss the target: the rollup stays, and the sorted value columns it is built from"
    )
    entry = {
        "bench": "landing",
        "what": f"landing page data of a {args.spans / 1e6:g}M-span run, uncompacted shards, cold: with the rollup, "
        "with shard indexes alone (sorted value columns), from trajectory rows; stand-in shards whose sidecars "
        "hold the run's trajectory rows (the page reads only sidecars)",
        "command": "python bench/bench_landing.py",
        "figure": figure,
        "target": f"< {TARGET_S} s cold",
        "met": all(r["rollup"]["cold"] < TARGET_S for r in results.values()),
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    write_result(RESULT, [entry])
    print(json.dumps(entry, indent=1))


if __name__ == "__main__":
    main()
