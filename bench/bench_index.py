"""Shard indexes (issue 13): does the cost follow the question or the run?

Generates runs through the storage writer directly (``SpanWriter``, the
batches of ``bench_scale.chunk``: trajectories of 8 spans, each recorded by
one worker; 16 workers' shards for the big runs), then measures, each
number in a fresh Python process (imports excluded: "cold" means nothing
read yet in that process; the OS page cache is warm):

1. one trajectory, ``tracer.read_spans(run, trace_ids=[t])``: a 10M-span run
   against a 10k-span run, shards uncompacted (target: within 3x);
2. the viewer's landing page (``viewer.data.runs.list_steps``,
   ``viewer.data.tokens.has_token_stats`` and ``load_step_partials``, what the
   overview page reads, with its tiles and table computed): 1M against 1k spans (target: within 2x) and 10M spans
   (target: under 2 s); beside it the same numbers from every trajectory row
   (``load_trajectories``, what the page read before) and the page with the
   runs' rollups (``tracer.index.rollup``) moved aside; then, since the 1k run
   is one writer over 10 steps and the 1M run 16 over 100, the 1M page
   against the smallest run of its own layout (the run's size alone), and
   the 1M run compacted to one file against the 1k run;
3. one step, ``tracer.read_spans(run, columns=..., steps=[k])``: 10M spans
   uncompacted against a copy of the same run after ``rollout-trace compact``
   (target: within 3x), fresh processes taking turns; twice: the big run
   (one 32 MB shard per writer, each holding every step) and a run whose
   writers start a new shard every ``--step-shard-mb`` (shards hold a few
   steps each: most shards hold nothing of step k); then one trajectory of
   each compacted copy, through the compacted files' indexes and without them.

The same reads with the shard indexes moved aside (what readers did before)
are printed beside them.

    python bench/bench_index.py [--big 10000000] [--mid 1000000] [--dir DIR]   # runs already in DIR are reused
    python bench/bench_index.py --only step [--step-shard-mb 2] [--repeat 3]   # part 3 alone
    python bench/bench_index.py --only landing   # part 2 alone
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from bench_scale import SPANS_PER_TRAJECTORY, chunk  # noqa: E402

import tracer  # noqa: E402
from tracer import schema as S  # noqa: E402
from tracer.index import rollup  # noqa: E402
from tracer.index.closed import shard_closed  # noqa: E402
from tracer.index.readers import read_step_partials  # noqa: E402
from tracer.index.rollup import ROLLUP_NAME  # noqa: E402
from tracer.index.shard import INDEX_SUFFIX  # noqa: E402
from tracer.storage.compact import compact  # noqa: E402
from tracer.storage.writer import SpanWriter  # noqa: E402

BATCH_ROWS = 8192
STEP_COLUMNS = [S.TRACE_ID, S.SPAN_ID, S.PARENT_SPAN_ID, S.NAME, S.KIND, S.STATUS, S.INPUTS, S.OUTPUTS]


def generate(
    run_dir: str,
    spans: int,
    steps: int,
    workers: int,
    max_file_bytes: int = 32 * 1024 * 1024,
    process_ids: bool = False,
) -> float:
    """Write ``spans`` spans over ``steps`` steps, each step's trajectories spread over ``workers`` writers.

    ``process_ids``: trace ids as the recorder makes them (a prefix per writer, then a fixed-width
    counter), not :func:`trace_id`'s; each shard's trace ids then span a range of their own.
    """
    t0 = time.perf_counter()
    meta = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION, S.META_PROJECT: "bench", S.META_EXPERIMENT: "index"}
    writers = [SpanWriter(run_dir, meta, max_file_bytes=max_file_bytes, on_close=shard_closed) for _ in range(workers)]
    unit = SPANS_PER_TRAJECTORY * workers
    per_step = max(unit, spans // steps // unit * unit)
    start = 0
    now = time.time_ns()
    for step in range(steps):
        per_worker = per_step // workers
        for writer in writers:
            for off in range(0, per_worker, BATCH_ROWS):
                n = min(BATCH_ROWS, per_worker - off)
                batch = chunk(start, n, step, now)
                if process_ids:
                    batch = with_process_ids(batch, writers.index(writer))
                writer.write(batch)
                start += n
    for writer in writers:
        writer.close()
    return time.perf_counter() - t0


def trace_id(i: int) -> str:
    return "t" * 16 + str(i)


def with_process_ids(batch: pa.RecordBatch, worker: int) -> pa.RecordBatch:
    """``batch`` with :func:`trace_id`'s ids rewritten as ``{worker:016x}{counter:016d}``."""
    at = batch.schema.get_field_index(S.TRACE_ID)
    counter = pc.utf8_lpad(pc.utf8_slice_codeunits(batch.column(at), 16), 16, "0")
    return batch.set_column(at, batch.schema.field(at), pc.binary_join_element_wise(f"{worker:016x}", counter, ""))


# -- one measurement per process --------------------------------------------------------------


def measure(kind: str, run: str, arg: int) -> dict[str, float]:
    """Time one question in this (fresh) process: the first call, then the median of a few more."""
    if kind == "trajectory":
        calls = [lambda i=i: tracer.read_spans(run, trace_ids=[trace_id(arg + 97 * i)]) for i in range(6)]
    elif kind in ("landing", "landing_rows"):
        from viewer.data import runs as D
        from viewer.data import tokens as T

        pa.array([0])  # pyarrow imports pandas at its first array built: an import, so not timed

        def page() -> dict[str, object]:
            """What the overview reads now: the steps, whether token stats were logged, the per-step aggregates."""
            steps = D.list_steps(run)
            stats = T.has_token_stats(run)
            parts = D.load_step_partials(run).table
            return {"rows": D.overview_of(parts), "totals": D.totals_of(parts, steps.rows), "stats": stats}

        def page_from_rows() -> dict[str, object]:
            """What it read before: the same numbers from every trajectory row, token stats from every name."""
            steps = D.list_steps(run)
            names = tracer.read_spans(run, columns=[S.NAME]).column(S.NAME)
            stats = bool(pc.any(pc.fill_null(pc.equal(names, "log_token_stats"), False)).as_py())
            rows = D.load_trajectories(run).table
            return {"rows": D.overview(rows), "totals": D.run_totals(rows, steps.rows), "stats": stats}

        calls = [page if kind == "landing" else page_from_rows] * 3
    elif kind == "step":
        calls = [lambda i=i: tracer.read_spans(run, columns=STEP_COLUMNS, steps=[arg + i]) for i in range(4)]
    else:
        raise SystemExit(f"unknown measurement {kind!r}")
    times = []
    for call in calls:
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
        if len(times) == 2 and times[0] > 2.0:  # a whole-run scan: one warm repeat says enough
            break
    rows = out.num_rows if hasattr(out, "num_rows") else out["totals"]["trajectories"]
    return {"cold": times[0], "warm": statistics.median(times[1:]), "rows": rows}


def fresh(kind: str, run: str, arg: int = 0) -> dict[str, float]:
    cmd = [sys.executable, os.path.abspath(__file__), "--measure", kind, "--run", run, "--arg", str(arg)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def hide_indexes(run: str, rollups: bool = True) -> list[tuple[str, str]]:
    """Move the shard indexes (and the runs' rollups, unless told not to) aside: what readers did before."""
    moved = []
    found = glob.glob(os.path.join(run, "**", "*" + INDEX_SUFFIX), recursive=True)
    if rollups:
        found += glob.glob(os.path.join(run, "**", ROLLUP_NAME), recursive=True)
    for side in found:
        os.rename(side, side + ".off")
        moved.append((side + ".off", side))
    return moved


def restore(moved: list[tuple[str, str]]) -> None:
    for a, b in moved:
        os.rename(a, b)


def both(kind: str, run: str, arg: int = 0) -> tuple[dict[str, float], dict[str, float]]:
    """(with the shard indexes, with them moved aside)."""
    with_index = fresh(kind, run, arg)
    moved = hide_indexes(run)
    try:
        without = fresh(kind, run, arg)
    finally:
        restore(moved)
    return with_index, without


def no_rollup(kind: str, run: str, arg: int = 0) -> dict[str, float]:
    """``kind`` in a fresh process with the run's rollup moved aside (its shard indexes kept)."""
    moved = [(f + ".off", f) for f in glob.glob(os.path.join(run, "**", ROLLUP_NAME), recursive=True)]
    for a, b in moved:
        os.rename(b, a)
    try:
        return fresh(kind, run, arg)
    finally:
        restore(moved)


def line(label: str, a: dict[str, float], b: dict[str, float], what: str = "cold") -> str:
    return f"{label}: {a[what] * 1e3:8.1f} ms vs {b[what] * 1e3:8.1f} ms -> {a[what] / b[what]:.2f}x"


def step_part(paths: dict[str, str], step: int, repeat: int, compact_mb: float | None = None) -> None:
    """Part 3: one step of each big run, uncompacted against a compacted copy, fresh processes taking turns."""
    for name in ("big", "rotated"):
        run = paths[name]
        shards = len(tracer.list_trace_files(run))
        copy = os.path.join(
            os.path.dirname(os.path.dirname(os.path.dirname(run))), name + "-compacted", "bench", "index"
        )
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("*" + INDEX_SUFFIX))
        t0 = time.perf_counter()
        report = compact(copy) if compact_mb is None else compact(copy, target_bytes=int(compact_mb * 1024 * 1024))
        outs = tracer.read.indexed_files(copy)
        print(
            f"\n3. one step, read_spans(run, columns=8, steps=[k]), {name} run ({shards} shards; a copy compacted "
            f"{report.files_in} files -> {report.files_out} in {time.perf_counter() - t0:.0f} s, "
            f"{sum(i is not None for _, i in outs)} of them with a valid index), "
            f"median of {repeat} fresh processes each, taking turns:"
        )
        indexed: list[dict[str, float]] = []
        compacted: list[dict[str, float]] = []
        for i in range(repeat):
            indexed.append(fresh("step", run, step + i))
            compacted.append(fresh("step", copy, step + i))
        moved = hide_indexes(run)
        try:
            bare = fresh("step", run, step)
        finally:
            restore(moved)
        unc_i = {w: statistics.median(m[w] for m in indexed) for w in ("cold", "warm")}
        comp = {w: statistics.median(m[w] for m in compacted) for w in ("cold", "warm")}
        for what in ("cold", "warm"):
            print("  " + line(f"uncompacted indexed vs compacted, {what}", unc_i, comp, what) + " (target <= 3x)")
            print("  " + line(f"uncompacted no index vs compacted, {what}", bare, comp, what))
        print(
            "  cold, each turn (indexed / compacted, ms): "
            + ", ".join(f"{a['cold'] * 1e3:.0f}/{b['cold'] * 1e3:.0f}" for a, b in zip(indexed, compacted, strict=True))
        )
        # One trajectory of the compacted copy: through its files' own indexes, and read whole without them.
        t = runs_traj(copy) // 3
        unc_t = fresh("trajectory", run, t)
        comp_t, comp_n = both("trajectory", copy, t)
        for what in ("cold", "warm"):
            print("  " + line(f"one trajectory, compacted indexed vs uncompacted indexed, {what}", comp_t, unc_t, what))
            print("  " + line(f"one trajectory, compacted no index vs indexed, {what}", comp_n, comp_t, what))
        shutil.rmtree(os.path.dirname(os.path.dirname(copy)), ignore_errors=True)


def runs_traj(run: str) -> int:
    """Trajectories of a bench run (its spans over :data:`SPANS_PER_TRAJECTORY`), from its files' indexes."""
    return tracer.read.read_steps(run)[1] // SPANS_PER_TRAJECTORY


def rollup_cost(run: str, repeat: int = 3) -> str:
    """What keeping ``run``'s rollup costs the process that closes a shard: the update that merges one
    newly closed shard in, and one that rebuilds from every file (medians of ``repeat``, this process)."""
    files = tracer.list_trace_files(run)
    copy = run.rstrip("/") + "-rollup"
    merged, built = [], []
    for _ in range(repeat):
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns(ROLLUP_NAME + "*"))
        last = os.path.join(copy, os.path.basename(files[-1]))
        aside = os.path.dirname(copy) + "/last.arrow"
        os.rename(last, aside)  # a rename keeps size, mtime and inode: the rollup's stamp
        rollup.update(copy, read_step_partials)  # every file but the last
        os.rename(aside, last)
        t0 = time.perf_counter()
        rollup.update(copy, read_step_partials)  # the last file closes: merged in (its trace ids are its own)
        merged.append(time.perf_counter() - t0)
        os.remove(os.path.join(copy, ROLLUP_NAME))
        t0 = time.perf_counter()
        rollup.update(copy, read_step_partials)  # no rollup yet (or a trajectory shared): built from every file
        built.append(time.perf_counter() - t0)
    shutil.rmtree(copy, ignore_errors=True)
    size = os.path.getsize(os.path.join(run, ROLLUP_NAME)) if os.path.exists(os.path.join(run, ROLLUP_NAME)) else 0
    return (
        f"rollup update: one shard merged in {statistics.median(merged) * 1e3:.1f} ms, rebuilt from "
        f"{len(files)} files {statistics.median(built) * 1e3:.1f} ms (medians of {repeat}); {size / 1e6:.2f} MB"
    )


def landing_part(paths: dict[str, str]) -> None:
    """Part 2: the overview's data from per-step aggregates, beside the same from every trajectory row."""
    print("\n2. viewer landing page (list_steps, the overview's aggregates, its tiles and table), fresh process:")
    for name in ("1k-p", "mid-p", "big-p"):
        if name in paths:
            print(f"  {name}: {rollup_cost(paths[name])}")
    for ids, sfx in (("the recorder's trace ids (a prefix per writer)", "-p"), ("this bench's trace ids", "")):
        if "mid" + sfx not in paths:
            continue
        print(f"  {ids}:")
        turns: dict[str, list[dict[str, float]]] = {}
        for _ in range(3):  # fresh processes taking turns; the median of each
            for name, measure_with in (("mid", fresh), ("1k", fresh), ("mid-s", no_rollup), ("1k-s", no_rollup)):
                turns.setdefault(name, []).append(measure_with("landing", paths[name.split("-")[0] + sfx]))
        med = {k: {w: statistics.median(m[w] for m in v) for w in ("cold", "warm")} for k, v in turns.items()}
        mid_i, one_i = med["mid"], med["1k"]
        mid_n, one_n = (both("landing", paths[name + sfx])[1] for name in ("mid", "1k"))
        mid_r, one_r = fresh("landing_rows", paths["mid" + sfx]), fresh("landing_rows", paths["1k" + sfx])
        print("    " + line("per-step aggregates, mid vs 1k (medians of 3)", mid_i, one_i) + " (target <= 2x)")
        print(
            "    "
            + line("without the run rollups (shard indexes alone), mid vs 1k (medians of 3)", med["mid-s"], med["1k-s"])
        )
        print("    " + line("every trajectory row (before), mid vs 1k", mid_r, one_r))
        print("    " + line("no index, mid vs 1k", mid_n, one_n))
        print("    " + line("mid: aggregates vs every row", mid_i, mid_r))
        if "same" + sfx in paths:  # the run size alone: the smallest run with mid's writers and steps
            same_i = fresh("landing", paths["same" + sfx])
            print("    " + line("per-step aggregates, mid vs the same layout's smallest run", mid_i, same_i))
        if sfx == "-p":  # mid compacted (one file and its index, as the 1k run is one shard), and 1k compacted
            copies, comp = [], {}
            for name in ("mid", "1k"):
                copy = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(paths[name + sfx]))), name + "-c")
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(os.path.dirname(paths[name + sfx]), os.path.join(copy, "bench"))
                copies.append(copy)
                report = compact(os.path.join(copy, "bench", "index"))
                print(f"    ({name} compacted: {report.files_in} files -> {report.files_out})")
            for _ in range(3):  # fresh processes taking turns; the median of each
                for name, copy in zip(("mid", "1k"), copies, strict=True):
                    comp.setdefault(name, []).append(fresh("landing", os.path.join(copy, "bench", "index")))
                comp.setdefault("one", []).append(fresh("landing", paths["1k" + sfx]))
            med = {k: {w: statistics.median(m[w] for m in v) for w in ("cold", "warm")} for k, v in comp.items()}
            print(
                "    "
                + line("per-step aggregates, mid compacted vs 1k (medians of 3)", med["mid"], med["one"])
                + " (target <= 2x)"
            )
            print("    " + line("per-step aggregates, mid compacted vs 1k compacted", med["mid"], med["1k"]))
            for copy in copies:
                shutil.rmtree(copy, ignore_errors=True)
        if "big" + sfx not in paths:
            continue
        big_l, big_r = fresh("landing", paths["big" + sfx]), fresh("landing_rows", paths["big" + sfx])
        for label, got in (("per-step aggregates", big_l), ("every trajectory row (before)", big_r)):
            print(
                f"    {label}, big: {got['cold']:.3f} s cold, {got['warm']:.3f} s warm "
                f"({got['rows']:,} trajectories; target < 2 s)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big", type=int, default=10_000_000)
    ap.add_argument("--mid", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None)
    ap.add_argument(
        "--only",
        choices=["step", "landing"],
        default=None,
        help="run only this part (step: part 3, on the big runs alone; landing: part 2, on 1k, mid and big)",
    )
    ap.add_argument(
        "--step-shard-mb",
        type=float,
        default=2.0,
        help="part 3 also reads a big run whose writers start a new shard every this many MB (shards hold a few steps)",
    )
    ap.add_argument("--repeat", type=int, default=3, help="part 3: fresh processes per alternative")
    ap.add_argument(
        "--compact-mb",
        type=float,
        default=None,
        help="part 3: compact the copies into files of about this many MB (default: compaction's own target)",
    )
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--arg", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.run, args.arg)))
        return
    root = args.dir or tempfile.mkdtemp(prefix="rt-index-")
    runs = {
        "1k": (1_000, 10, 1),
        "10k": (10_000, 10, 1),
        "mid": (args.mid, 100, 16),
        "big": (args.big, 100, 16),
        "rotated": (args.big, 100, 16),
        # Part 2 also reads runs whose trace ids are the recorder's (a prefix per process): "-p".
        "1k-p": (1_000, 10, 1),
        # The smallest run of mid's layout (16 writers, 100 steps, one trajectory per writer a step).
        "same-p": (SPANS_PER_TRAJECTORY * 16 * 100, 100, 16),
        "mid-p": (args.mid, 100, 16),
        "big-p": (args.big, 100, 16),
    }
    if args.only == "step":
        runs = {k: v for k, v in runs.items() if k in ("big", "rotated")}
    if args.only == "landing":
        runs = {k: v for k, v in runs.items() if k in ("1k", "mid", "big", "1k-p", "same-p", "mid-p", "big-p")}
    elif args.only is None:
        runs = {k: v for k, v in runs.items() if k != "big-p"}  # part 2 reads big-p only when run alone
    paths = {}
    for name, (spans, steps, workers) in runs.items():
        path = os.path.join(root, name, "bench", "index")
        shard_bytes = int(args.step_shard_mb * 1024 * 1024) if name == "rotated" else 32 * 1024 * 1024
        if args.dir and os.path.isdir(path) and tracer.list_trace_files(path):
            gen_s = 0.0  # written by an earlier run into --dir: read as it is
        else:
            gen_s = generate(path, spans, steps, workers, shard_bytes, process_ids=name.endswith("-p"))
        files = tracer.list_trace_files(path)
        disk = sum(os.path.getsize(f) for f in files)
        side = sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "*" + INDEX_SUFFIX)))
        print(
            f"{name}: {spans:,} spans, {steps} steps, {len(files)} shard(s), {disk / 1e6:.1f} MB "
            f"+ {side / 1e6:.1f} MB of shard indexes, written in {gen_s:.1f} s",
            flush=True,
        )
        paths[name] = path
    if args.only == "step":
        step_part(paths, runs["big"][1] // 2, args.repeat, args.compact_mb)
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
        return
    if args.only == "landing":
        landing_part(paths)
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
        return
    big_traj = runs["big"][0] // SPANS_PER_TRAJECTORY
    small_traj = runs["10k"][0] // SPANS_PER_TRAJECTORY

    print("\n1. one trajectory, read_spans(run, trace_ids=[t]), uncompacted (big vs 10k):")
    big_i, big_n = both("trajectory", paths["big"], big_traj // 3)
    small_i, small_n = both("trajectory", paths["10k"], small_traj // 3)
    for what in ("cold", "warm"):
        print("  " + line(f"indexed, {what}", big_i, small_i, what) + " (target <= 3x)")
        print("  " + line(f"no index, {what}", big_n, small_n, what))

    landing_part(paths)

    step_part(paths, runs["big"][1] // 2, args.repeat)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
