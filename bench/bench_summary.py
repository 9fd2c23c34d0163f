"""The trajectory model's cost: summarize (Arrow, many trajectories per call) and turns, per trajectory.

Alternatives measured in the same run:
  * summarize over 10k and 100k trajectories at once (read_trajectories, live batches);
  * summarize of one trajectory at a time (the MLflow exporter's per-trace summary);
  * the row-by-row Python summary the live exporters used before (kept here as the baseline);
  * trajectory_turns over many trajectories (conversation, tokens, tool calls).

Run: python bench/bench_summary.py [--trajectories 10000 100000]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pyarrow as pa

import tracer
from tracer import schema as S
from tracer.summary import summarize, trajectory_turns


def spans_of(n_traj: int) -> list[dict[str, Any]]:
    """6 spans per trajectory (root, 2 llm, 2 tools one failing, a reward) with a verl-shaped reply."""
    rows: list[dict[str, Any]] = []
    base = {c: None for c in tracer.schema.SPAN_COLUMNS}
    reply = json.dumps({"token_ids": list(range(64)), "log_probs": [-0.1] * 64, "token_text": "x " * 64})
    for t in range(n_traj):
        tid = f"{t:032x}"
        ctx = {S.TRACE_ID: tid, S.STEP: t // 256, S.SAMPLE_INDEX: str(t % 64), S.ROLLOUT_N: t % 4, S.VALIDATE: False}
        t0 = t * 1000
        rows.append({**base, **ctx, S.SPAN_ID: "r", S.NAME: "agent_loop", S.KIND: S.KIND_ROLLOUT, S.START_NS: t0,
                     S.END_NS: t0 + 900, S.STATUS: "ok", S.OUTPUTS: '{"response_ids":[1,2]}'})  # fmt: skip
        for k in range(2):
            rows.append({**base, **ctx, S.SPAN_ID: f"l{k}", S.PARENT_SPAN_ID: "r", S.NAME: "generate",
                         S.KIND: S.KIND_LLM, S.START_NS: t0 + 10 + k * 400, S.END_NS: t0 + 200 + k * 400,
                         S.STATUS: "ok", S.INPUTS: '{"prompt_ids":[1,2,3],"prompt_text":"q"}', S.OUTPUTS: reply})  # fmt: skip
            status = "error" if k else "ok"
            rows.append({**base, **ctx, S.SPAN_ID: f"t{k}", S.PARENT_SPAN_ID: "r", S.NAME: "calc",
                         S.KIND: S.KIND_TOOL, S.START_NS: t0 + 210 + k * 400, S.END_NS: t0 + 300 + k * 400,
                         S.STATUS: status, S.INPUTS: '{"parameters":{"x":1}}',
                         S.OUTPUTS: '[{"__type__":"ToolResponse","text":"7"},0.0,{}]',
                         S.ERROR: '{"type":"E","message":"m"}' if k else None})  # fmt: skip
        rows.append({**base, **ctx, S.SPAN_ID: "w", S.PARENT_SPAN_ID: "r", S.NAME: S.REWARD_SPAN_NAME,
                     S.KIND: S.KIND_REWARD, S.START_NS: t0 + 950, S.END_NS: t0 + 950, S.STATUS: "ok",
                     S.REWARD: 1.0, S.ATTRIBUTES: '{"advantage":0.5}'})  # fmt: skip
    return rows


def row_by_row(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The previous live summary: Python over span dicts, one trajectory at a time (baseline)."""
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_trace.setdefault(r[S.TRACE_ID], []).append(r)
    out = []
    for tid, rs in by_trace.items():
        logs = [r for r in rs if r[S.KIND] == S.KIND_REWARD and r[S.NAME] == S.REWARD_SPAN_NAME]
        body = [r for r in rs if r not in logs]
        root = next((r for r in body if r[S.PARENT_SPAN_ID] is None), None)
        last = max(logs, key=lambda r: r[S.END_NS]) if logs else None
        out.append(
            {
                S.TRACE_ID: tid,
                S.STATUS: root[S.STATUS] if root else S.STATUS_INCOMPLETE,
                S.REWARD: last[S.REWARD] if last else None,
                S.NUM_SPANS: len(body),
                S.NUM_LLM_CALLS: sum(r[S.KIND] == S.KIND_LLM for r in body),
                S.NUM_TOOL_CALLS: sum(r[S.KIND] == S.KIND_TOOL for r in body),
                S.NUM_TOOL_ERRORS: sum(r[S.KIND] == S.KIND_TOOL and r[S.STATUS] != "ok" for r in body),
                S.START_NS: min(r[S.START_NS] for r in body),
                S.END_NS: max(r[S.END_NS] for r in body),
            }
        )
    return out


def timed(fn: Any, rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajectories", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--one-at-a-time", type=int, default=1000, help="trajectories summarised one per call")
    args = ap.parse_args()
    for n in args.trajectories:
        rows = spans_of(n)
        table = pa.Table.from_pylist(rows, schema=tracer.schema.SPAN_SCHEMA)
        arrow_s = timed(lambda table=table: summarize(table))
        python_s = timed(lambda rows=rows: row_by_row(rows), rounds=1)
        sample = min(n, 20_000)
        sub = table.slice(0, sample * 6)
        turns_s = timed(lambda sub=sub: trajectory_turns(sub), rounds=1)
        print(
            f"{n:>7} trajectories ({table.num_rows} spans): summarize {arrow_s:.3f} s = {arrow_s / n * 1e6:.2f} us/traj; "
            f"row-by-row Python {python_s:.3f} s = {python_s / n * 1e6:.2f} us/traj -> Arrow {python_s / arrow_s:.1f}x faster; "
            f"turns {turns_s / sample * 1e6:.1f} us/traj (over {sample})"
        )
    k = args.one_at_a_time
    rows = spans_of(k)
    per = [rows[i * 6 : (i + 1) * 6] for i in range(k)]
    one_s = timed(lambda: [summarize(pa.Table.from_pylist(p, schema=tracer.schema.SPAN_SCHEMA)) for p in per], rounds=1)
    many = pa.Table.from_pylist(rows, schema=tracer.schema.SPAN_SCHEMA)
    many_s = timed(lambda: summarize(many))
    print(
        f"one trajectory per call ({k} calls, from_pylist + summarize, the MLflow exporter's per-trace summary): "
        f"{one_s / k * 1e6:.0f} us/traj; batched: {many_s / k * 1e6:.2f} us/traj -> {one_s / many_s:.0f}x; "
        f"against the previous shared summary's 2 ms/traj one at a time: {2e-3 / (one_s / k):.1f}x"
    )


if __name__ == "__main__":
    main()
