"""Benchmark: logging trajectory tables to wandb (offline), per step.

Ways compared, same rows (~600 B of conversation text each), same run settings:

- incremental: one ``wandb.Table(log_mode="INCREMENTAL")``, the step's rows
  added and the table logged once per step (what rollout-trace does);
- per-step tables: a new (immutable) ``wandb.Table`` per step under one key;
- mutable, re-logged: one ``log_mode="MUTABLE"`` table grown and logged whole
  every step (the cumulative table people often write; rows past
  ``Table.MAX_ROWS`` are cut from its media file);
- per-row: one single-row table logged per trajectory (measured on fewer rows:
  it is slow);

plus rollout-trace's whole post-hoc path (read trace files, build rows, log)
on a recorded run of the same size.

Run: ``.venv/bin/python bench/bench_export_wandb.py [--rows 10000] [--steps 10] [--per-row 500] [--repeat 2]``
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import tempfile
import time
from typing import Any


def _env(root: str) -> None:
    for var, sub in (
        ("WANDB_DIR", ""),
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_CONFIG_DIR", "config"),
    ):
        path = os.path.join(root, sub)
        os.makedirs(path, exist_ok=True)
        os.environ[var] = path
    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"


COLUMNS = ["step", "sample_index", "rollout_n", "reward", "conversation"]


def _rows(n: int, steps: int) -> list[list[Any]]:
    text = ("[user]\nWhat is 12 + 30?\n\n[assistant]\nLet me compute.\n-> calculator(12+30)\n\n[tool]\n42\n\n" * 6)[
        :600
    ]
    per = n // steps
    return [[i // per + 1, str(i % per // 4), i % 4, float(i % 2), text + str(i)] for i in range(n)]


def _run(name: str) -> Any:
    import wandb

    return wandb.init(project="bench", name=name, mode="offline", reinit="create_new")


def _table_rows_on_disk(run: Any, key: str) -> int:
    total = 0
    for file in glob.glob(os.path.join(run.dir, "media", "table", f"{key}_*.table.json")):
        with open(file, encoding="utf-8") as f:
            total += len(json.load(f)["data"])
    return total


def bench_incremental(rows: list[list[Any]], steps: int) -> tuple[float, int]:
    import wandb

    t0 = time.perf_counter()
    run = _run("incremental")
    table = wandb.Table(columns=COLUMNS, log_mode="INCREMENTAL")
    per = len(rows) // steps
    for s in range(steps):
        for row in rows[s * per : (s + 1) * per]:
            table.add_data(*row)
        run.log({"traj": table}, step=s + 1)
    run.finish()
    return time.perf_counter() - t0, _table_rows_on_disk(run, "traj")


def bench_per_step(rows: list[list[Any]], steps: int) -> tuple[float, int]:
    import wandb

    t0 = time.perf_counter()
    run = _run("per-step")
    per = len(rows) // steps
    for s in range(steps):
        run.log({"traj": wandb.Table(columns=COLUMNS, data=rows[s * per : (s + 1) * per])}, step=s + 1)
    run.finish()
    return time.perf_counter() - t0, _table_rows_on_disk(run, "traj")


def bench_mutable(rows: list[list[Any]], steps: int) -> tuple[float, int]:
    import wandb

    t0 = time.perf_counter()
    run = _run("mutable")
    table = wandb.Table(columns=COLUMNS, log_mode="MUTABLE")
    per = len(rows) // steps
    for s in range(steps):
        for row in rows[s * per : (s + 1) * per]:
            table.add_data(*row)
        run.log({"traj": table}, step=s + 1)
    run.finish()
    # Only the last logged version counts: earlier ones are superseded.
    files = sorted(glob.glob(os.path.join(run.dir, "media", "table", "traj_*.table.json")), key=os.path.getmtime)
    with open(files[-1], encoding="utf-8") as f:
        last = len(json.load(f)["data"])
    return time.perf_counter() - t0, last


def bench_per_row(rows: list[list[Any]]) -> tuple[float, int]:
    import wandb

    t0 = time.perf_counter()
    run = _run("per-row")
    for i, row in enumerate(rows):
        run.log({"traj": wandb.Table(columns=COLUMNS, data=[row])}, step=i)
    run.finish()
    return time.perf_counter() - t0, _table_rows_on_disk(run, "traj")


def bench_rollout_trace(root: str, n: int, steps: int) -> tuple[float, float, int]:
    import tracer
    from tracer.exporters import wandb as wandb_export

    @tracer.rollout_trace_op(kind="llm", name="generate")
    def generate(prompt_ids: list[int]) -> dict[str, Any]:
        return {"response_ids": list(range(40)), "response_text": "Let me compute. " * 4}

    @tracer.rollout_trace_op(kind="tool", name="calculator")
    def calculator(expression: str) -> str:
        return "42"

    @tracer.rollout_trace_op(kind="rollout", name="agent_loop")
    def agent_loop(q: str) -> dict[str, Any]:
        generate(list(range(60)))
        out = calculator("12+30")
        generate(list(range(80)))
        return {
            "messages": [
                {"role": "system", "content": "You are a calculator agent. " * 4},
                {"role": "user", "content": q},
                {
                    "role": "assistant",
                    "content": "Let me compute.",
                    "tool_calls": [
                        {
                            "id": "c0",
                            "type": "function",
                            "function": {"name": "calculator", "arguments": '{"expression": "12+30"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c0", "name": "calculator", "content": out},
                {"role": "assistant", "content": "The answer is 42."},
            ]
        }

    cfg = tracer.init(project_name="bench", experiment_name="export", output_dir=os.path.join(root, "traces"))
    per = n // steps
    t0 = time.perf_counter()
    for s in range(steps):
        for i in range(per):
            with tracer.rollout_trace_attr(sample_index=i // 4, step=s + 1, rollout_n=i % 4):
                agent_loop(f"What is 12 + 30? ({i})")
                tracer.log_reward(float(i % 2), advantage=0.5 - i % 2)
    tracer.shutdown()
    record_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = wandb_export.export_files(cfg.run_dir, progress=False, log_val_generations=0)
    return time.perf_counter() - t0, record_s, report.trajectories_sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--per-row", type=int, default=500, help="rows for the per-row loop (slow)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the table ways, interleaved")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-wandb-")
    _env(root)
    import wandb

    rows = _rows(args.rows, args.steps)
    # Warm-up: the first run of a process starts wandb's service.
    t0 = time.perf_counter()
    _run("warm-up").finish()
    t0 = time.perf_counter()
    _run("empty").finish()
    empty_s = time.perf_counter() - t0
    results = []
    ways = (
        ("incremental table, logged per step (rollout-trace)", lambda: bench_incremental(rows, args.steps)),
        ("new table per step", lambda: bench_per_step(rows, args.steps)),
        ("one MUTABLE table re-logged whole per step", lambda: bench_mutable(rows, args.steps)),
    )
    for _ in range(args.repeat):
        for label, fn in ways:
            secs, kept = fn()
            results.append((label, len(rows), secs, kept))
    secs, kept = bench_per_row(rows[: args.per_row])
    results.append(("one single-row table per trajectory", args.per_row, secs, kept))
    export_s, record_s, sent = bench_rollout_trace(root, args.rows, args.steps)
    wandb.teardown()
    print(f"wandb {wandb.__version__}, {args.rows} rows of ~600 B text over {args.steps} steps, offline")
    print("| way | rows | seconds | rows/s | rows on disk |")
    print("|---|---|---|---|---|")
    for label, n, secs, kept_rows in results:
        print(f"| {label} | {n} | {secs:.2f} | {n / secs:,.0f} | {kept_rows} |")
    print(
        f"| rollout-trace export_files from trace files (read, render, log) | {sent} | {export_s:.2f} | {sent / export_s:,.0f} | {sent} |"
    )
    print(
        f"(every row includes wandb.init + finish of an empty offline run: {empty_s:.2f} s here; "
        f"recording the {args.rows} trajectories with the tracer took {record_s:.2f} s)"
    )


if __name__ == "__main__":
    main()
