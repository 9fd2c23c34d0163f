"""Worker functions the reliability tests run in child processes (importable under spawn)."""

from __future__ import annotations

import threading

import tracer

SPANS_PER_TRAJECTORY = 3  # rollout root, tool, log_reward


@tracer.rollout_trace_op(kind="tool")
def calculator(expression: str) -> str:
    return str(len(expression))


@tracer.rollout_trace_op(kind="rollout")
def agent_loop(i: int) -> dict[str, object]:
    obs = calculator(f"{i} * 2")
    return {"messages": [{"role": "user", "content": str(i)}, {"role": "tool", "content": obs}]}


def record_trajectories(prefix: str, n: int) -> None:
    """Record ``n`` trajectories with sample_index ``{prefix}-{i}``."""
    for i in range(n):
        with tracer.rollout_trace_attr(sample_index=f"{prefix}-{i}", step=0):
            agent_loop(i)
            tracer.log_reward(1.0)


def record_in_threads(name: str, threads: int, per_thread: int, out: str | None) -> str:
    """Record from ``threads`` threads at once, then shut down; init first when ``out`` is given.

    A forked child passes ``out=None``: it keeps the recorder the fork hook gave it.
    """
    if out is not None:
        tracer.init(
            output_dir=out,
            project_name="faults",
            experiment_name="many",
            flush_interval_s=0.01,
            max_file_bytes=32_768,
        )
    workers = [threading.Thread(target=record_trajectories, args=(f"{name}-t{t}", per_thread)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    result = tracer.shutdown()
    if not result.ok:
        raise RuntimeError(f"{name}: {result.message}")
    return name


def record_and_return(name: str, n: int) -> None:
    """Record ``n`` trajectories and return without flushing (the process exit must write them)."""
    record_trajectories(name, n)
