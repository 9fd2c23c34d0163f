"""How fast the viewer draws a big run: first page of the list, one trajectory, a search.

Records a run of ``--spans`` spans (default 1,000,000) with tracer's public
API (``tracer.init`` + decorated functions, 8 spans per trajectory: a root,
3 llm turns, 3 tool calls, a reward), then times the viewer's data layer
(``viewer/data.py``, what ``viewer/app.py`` calls, cold: no cache) and the
whole app through Streamlit's ``AppTest``.

Usage::

    .venv/bin/python bench/bench_viewer.py                 # 1M spans in a temp dir
    .venv/bin/python bench/bench_viewer.py --spans 100000
    .venv/bin/python bench/bench_viewer.py --dir /tmp/big  # reuse a recorded run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import tracer
from viewer import data as D

SPANS_PER_TRAJECTORY = 8
GROUP = 8

SYSTEM = "You are a math agent. Think step by step, call the calculator tool when arithmetic is needed, and give the final answer after ####."


@tracer.rollout_trace_op(kind="llm", name="generate")
def _generate(prompt_ids: list[int], turn: int) -> dict[str, Any]:
    ids = list(range(1000 + turn, 1064 + turn))
    return {
        "response_ids": ids,
        "response_text": f"turn {turn}: let me compute this carefully using the calculator tool " * 3,
        "logprobs": [-0.01 * (i % 50) for i in range(64)],
        "finish_reason": "tool_calls",
    }


@tracer.rollout_trace_op(kind="tool", name="calculator")
def _calculator(expression: str) -> str:
    if expression.endswith("/0"):
        raise ZeroDivisionError("division by zero")
    return "42"


@tracer.rollout_trace_op(kind="rollout", name="agent_loop")
def _agent_loop(question: str, n: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    for turn in range(3):
        _generate(list(range(200 + 60 * turn)), turn)
        expr = f"{n} * {turn}" + ("/0" if (n + turn) % 11 == 0 else "")
        try:
            result = _calculator(expr)
        except ZeroDivisionError as exc:
            result = f"error: {exc}"
        messages.append(
            {
                "role": "assistant",
                "content": f"Turn {turn}: I will compute {expr}.",
                "tool_calls": [
                    {
                        "id": f"c{turn}",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": f'{{"expression": "{expr}"}}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "name": "calculator", "content": result})
    messages.append({"role": "assistant", "content": "The answer is #### 42"})
    return {"messages": messages, "answer": "42", "num_turns": 3}


def record(output_dir: str, spans: int, steps: int, worker: int = 0, workers: int = 1) -> str:
    """Record about ``spans`` spans over ``steps`` steps; return the run directory.

    With ``workers`` > 1 this process records only the samples with
    ``sample % workers == worker``, like one of several rollout workers.
    """
    trajectories = max(1, spans // SPANS_PER_TRAJECTORY)
    per_step = max(1, trajectories // steps)
    cfg = tracer.init(
        project_name="bench", experiment_name="viewer", backend="arrow", output_dir=output_dir, flush_interval_s=2.0
    )
    for step in range(steps):
        for k in range(per_step):
            sample, n = divmod(k, GROUP)
            if sample % workers != worker:
                continue
            with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                _agent_loop(f"Question {sample} of step {step}: what is 6 times 7? Explain.", n)
                tracer.log_reward(float((n + sample) % 2), advantage=((n + sample) % 2) - 0.5)
    tracer.shutdown(timeout=None)
    return cfg.run_dir


def record_parallel(output_dir: str, spans: int, steps: int, workers: int) -> None:
    """Record with ``workers`` processes at once (each writes its own files), as a multi-worker rollout does."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        list(
            pool.map(
                record,
                [output_dir] * workers,
                [spans] * workers,
                [steps] * workers,
                range(workers),
                [workers] * workers,
            )
        )


def timed(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    """Median seconds of ``repeat`` cold calls, and the last result."""
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def first_page(path: str, step: int | None) -> list[dict[str, Any]]:
    """What the list view does on a cold cache: the steps, one step's trajectories and tools, one page."""
    D.list_steps(path)
    t = D.load_step(path, step).table if step is not None else D.load_run(path).table
    page, _ = D.sort_and_page(D.apply_filters(t, D.Filters()), "reward", True, 0, 50)
    return D.list_rows(page)


def overview(path: str) -> list[dict[str, Any]]:
    """What the overview does on a cold cache: every trajectory, then tracer.step_metrics."""
    return D.overview(D.load_trajectories(path).table)


def one_trajectory(path: str, trace_id: str, step: int | None) -> int:
    """What the replay view computes for one trajectory (a deep link: only the trace id known)."""
    spans = D.load_trajectory(path, trace_id, step).table
    D.trajectory_summary(spans)
    D.messages(spans)
    D.waterfall(spans)
    D.token_turns(spans)
    D.tool_spans(spans)
    return spans.num_rows


def one_trajectory_in(path: str, trace_id: str, files: list[str]) -> int:
    """The replay's reads when the trace file index is known."""
    spans = D.load_trajectory(path, trace_id, None, files).table
    D.trajectory_summary(spans)
    D.messages(spans)
    return spans.num_rows


def app_first_render(path: str, query: dict[str, str]) -> tuple[float, float | None]:
    """Run the app once through Streamlit's AppTest with ``query``, cold caches.

    Returns the whole AppTest call (which adds ~1 s of test-harness work on
    this machine) and the script's own run time, what a served app spends
    on the server (None if Streamlit's internals moved and it cannot be
    measured).
    """
    import streamlit as st
    import streamlit.runtime.scriptrunner.script_runner as runner
    from streamlit.testing.v1 import AppTest

    spent: list[float] = []
    original = getattr(runner, "exec_func_with_error_handling", None)

    def timed_exec(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            spent.append(time.perf_counter() - t0)

    if original is not None:
        runner.exec_func_with_error_handling = timed_exec
    try:
        st.cache_resource.clear()
        app = os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(D.__file__))), "app.py"
        )  # viewer/data/__init__.py -> viewer/app.py
        at = AppTest.from_file(app, default_timeout=300)
        at.query_params["path"] = path
        for k, v in query.items():
            at.query_params[k] = v
        t = time.perf_counter()
        at.run()
        elapsed = time.perf_counter() - t
    finally:
        if original is not None:
            runner.exec_func_with_error_handling = original
    if at.exception:
        raise RuntimeError(f"app failed: {at.exception[0].message}")
    return elapsed, (spent[-1] if spent else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spans", type=int, default=1_000_000)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dir", help="use (or record into, if empty) this directory instead of a temp dir")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=1, help="record with this many processes (files per worker)")
    args = p.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="bench_viewer_")
    try:
        files = tracer.list_trace_files(root)
    except FileNotFoundError:
        files = []
    if not files:
        t = time.perf_counter()
        if args.workers > 1:
            record_parallel(root, args.spans, args.steps, args.workers)
        else:
            record(root, args.spans, args.steps)
        rec_s = time.perf_counter() - t
        print(f"recorded {args.spans:,} spans in {rec_s:.1f} s ({args.spans / rec_s:,.0f} spans/s) under {root}")
    files = tracer.list_trace_files(root)
    size = sum(os.path.getsize(f) for f in files)
    traj = D.load_trajectories(root).table
    nspans = tracer.read_spans(root, columns=[tracer.schema.SPAN_COLUMNS[0]]).num_rows
    steps = D.steps_of(traj)
    step = steps[len(steps) // 2]
    in_step = D.select(traj, step, None)
    tid = in_step.column(D.TRACE_ID)[in_step.num_rows // 2].as_py()
    print(
        f"run: {len(files)} file(s), {size / 1e6:.1f} MB, {nspans:,} span rows, {traj.num_rows:,} trajectories, {len(steps)} steps ({in_step.num_rows:,} in step {step})"
    )
    rows: list[tuple[str, float, str]] = []
    s, _ = timed(lambda: D.list_steps(root), args.repeat)
    rows.append(("list the steps (step column only)", s, "sidebar"))
    s, _ = timed(lambda: D.load_step(root, step), args.repeat)
    rows.append((f"trajectories + tools of step {step}", s, "list base, cached per step"))
    s, _ = timed(lambda: first_page(root, step), args.repeat)
    rows.append((f"first page of step {step}, cold (50 rows, sorted by reward)", s, "target < 2 s"))
    cached = D.load_step(root, step).table
    s, _ = timed(lambda: D.list_rows(D.sort_and_page(cached, "advantage", True, 3, 50)[0]), args.repeat)
    rows.append((f"another page of step {step}, sorted by advantage, cached", s, "paging/sorting"))
    s, _ = timed(
        lambda: D.apply_filters(cached, D.Filters(reward_min=0.5, tools=["calculator"], statuses=["ok"])), args.repeat
    )
    rows.append((f"filter step {step} (reward, tool, status), cached", s, ""))
    s, hits = timed(lambda: D.search_trace_ids(root, "Question 3 of", [step]), args.repeat)
    rows.append((f"full-text search in step {step} ({hits.table.num_rows:,} hits)", s, "cached per query"))
    s, n = timed(lambda: one_trajectory(root, tid, None), args.repeat)
    rows.append((f"one trajectory ({n} spans) from its trace id, cold, reading every file", s, "target < 0.5 s"))
    if len(files) > 1:
        s, index = timed(lambda: D.trace_file_index(root), 1)
        rows.append((f"trace id -> file index ({len(files)} files), once per run", s, "built from 3 files on"))
        own = D.files_of(index.table, [tid])
        s, n = timed(lambda: one_trajectory_in(root, tid, own), args.repeat)
        rows.append((f"one trajectory from its own file ({len(own)} of {len(files)})", s, "target < 0.5 s"))
    s, whole = timed(lambda: D.load_run(root), 1)
    rows.append((f"every trajectory + tools of the run ({traj.num_rows:,})", s, "all-steps list, cached per run"))
    everything = whole.table
    s, _ = timed(lambda: D.list_rows(D.sort_and_page(everything, "advantage", True, 100, 50)[0]), args.repeat)
    rows.append(
        (
            f"a page of all {everything.num_rows:,} trajectories, sorted by advantage, cached",
            s,
            "a big step stays responsive",
        )
    )
    s, _ = timed(
        lambda: D.apply_filters(everything, D.Filters(reward_min=0.5, tools=["calculator"], turns_min=2)), args.repeat
    )
    rows.append((f"filter all {everything.num_rows:,} trajectories (reward, tool, turns), cached", s, ""))
    s, hits = timed(lambda: D.search_trace_ids(root, "Question 3 of", None), 1)
    rows.append((f"full-text search over the whole run ({hits.table.num_rows:,} hits)", s, "cached per query"))
    s, _ = timed(lambda: overview(root), 1)
    rows.append(("overview data: every trajectory + step metrics", s, "landing page"))
    for label, query, note in (
        (f"app: ?step={step} list page", {"step": str(step), "view": "trajectories"}, "target < 2 s"),
        ("app: ?trace_id=... replay", {"trace_id": tid}, "target < 0.5 s"),
        ("app: overview (landing page)", {}, ""),
    ):
        app_first_render(root, query)  # once to import and compile; the timed run still has cold caches
        total, script = app_first_render(root, query)
        if script is not None:
            rows.append((f"{label}, cold caches: the script's run", script, note))
        rows.append((f"{label}, cold caches: whole AppTest call", total, "includes the test harness"))
    print()
    print("| what | seconds | note |")
    print("|---|---:|---|")
    for what, sec, note in rows:
        print(f"| {what} | {sec:.3f} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
