"""docs/sql.md: every documented DuckDB query runs on generated trace files and answers correctly."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from scale_fixtures import REPO, need

import tracer

DOC = os.path.join(REPO, "docs", "sql.md")
STEPS, SAMPLES, ROLLOUTS = 3, 4, 2


def _blocks(language: str) -> list[str]:
    with open(DOC, encoding="utf-8") as f:
        return re.findall(rf"```{language}\n(.*?)```", f.read(), flags=re.S)


def _generate(output_dir: str) -> None:
    """3 steps x 4 samples x 2 rollouts; the python tool fails on even samples; reward = step / 10 + rollout_n."""

    @tracer.rollout_trace_op(name="generate", kind="llm")
    async def generate(prompt_ids: list[int]) -> dict[str, Any]:
        return {"response_ids": [1, 2]}

    @tracer.rollout_trace_op(name="calculator", kind="tool")
    async def calculator(expression: str) -> str:
        return "4"

    @tracer.rollout_trace_op(name="python", kind="tool")
    async def python_tool(code: str, fail: bool) -> str:
        if fail:
            raise ZeroDivisionError("division by zero")
        return "ok"

    @tracer.rollout_trace_op(name="agent_loop", kind="rollout")
    async def rollout(sample: int) -> dict[str, Any]:
        for _ in range(1 + sample % 2):
            await generate([1, 2, 3])
        await calculator("2+2")
        try:
            await python_tool("1/0", fail=sample % 2 == 0)
        except ZeroDivisionError:
            pass
        return {"messages": []}

    async def main() -> None:
        for step in range(STEPS):
            for sample in range(SAMPLES):
                for n in range(ROLLOUTS):
                    with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                        await rollout(sample)
                    tracer.log_reward(step / 10 + n, step=step, sample_index=sample, rollout_n=n)

    tracer.init(output_dir=output_dir, project_name="gsm8k", experiment_name="grpo-1")
    asyncio.run(main())
    tracer.shutdown()


def _compact(run: str) -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "rollout-trace")
    proc = subprocess.run([exe, "compact", run], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[Any, ...]]]:
    """Run the doc's python blocks then each sql block (keyed by its first '-- ' comment)."""
    need("duckdb", "duckdb")
    import duckdb

    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("sql"))  # the doc's relative paths, as a user runs them
    try:
        _generate("traces")
        namespace: dict[str, Any] = {}
        for code in _blocks("python"):
            if "rollout-trace compact" in code:  # the block says to compact first: do so
                _compact(os.path.join("traces", "gsm8k", "grpo-1"))
            exec(compile(code, DOC, "exec"), namespace)
    finally:
        os.chdir(cwd)
    con = duckdb.connect()
    con.register("spans", namespace["spans"])
    con.register("trajectories", namespace["trajectories"])
    out: dict[str, list[tuple[Any, ...]]] = {
        "span counts (stream)": namespace["span_counts"],
        "tool calls by step (compacted dataset)": namespace["tool_calls_by_step"],
    }
    for sql in _blocks("sql"):
        title = sql.strip().splitlines()[0].removeprefix("--").strip()
        out[title] = con.sql(sql).fetchall()
    return out


def test_every_documented_query_runs(results: dict[str, list[tuple[Any, ...]]]) -> None:
    """Each documented question has a query, and each returns rows."""
    assert set(results) >= {
        "reward by step",
        "slowest tools",
        "slowest tool calls",
        "error rate by step",
        "tool error rate by tool",
        "longest trajectories",
        "span counts (stream)",
        "tool calls by step (compacted dataset)",
    }
    assert all(results.values())


def test_reward_by_step(results: dict[str, list[tuple[Any, ...]]]) -> None:
    """Reward by step averages the logged rewards of each step."""
    rows = results["reward by step"]
    assert [(r[0], r[1]) for r in rows] == [(s, SAMPLES * ROLLOUTS) for s in range(STEPS)]
    assert [r[2] for r in rows] == [pytest.approx(s / 10 + 0.5) for s in range(STEPS)]


def test_tool_error_rate_by_tool(results: dict[str, list[tuple[Any, ...]]]) -> None:
    """The python tool fails half the time with ZeroDivisionError; the calculator never."""
    rows = {r[0]: r for r in results["tool error rate by tool"]}
    calls = STEPS * SAMPLES * ROLLOUTS
    assert rows["python"][1:5] == (calls, calls // 2, pytest.approx(0.5), "ZeroDivisionError")
    assert rows["calculator"][1:4] == (calls, 0, 0.0)


def test_error_rate_by_step(results: dict[str, list[tuple[Any, ...]]]) -> None:
    """Trajectories succeed; one tool call in four fails."""
    for _step, trajs, traj_rate, tool_calls, tool_rate in results["error rate by step"]:
        assert (trajs, traj_rate, tool_calls, tool_rate) == (SAMPLES * ROLLOUTS, 0.0, 2 * trajs, 0.25)


def test_longest_and_slowest(results: dict[str, list[tuple[Any, ...]]]) -> None:
    """Longest trajectories have the most turns first; slowest tools list both tools."""
    assert results["longest trajectories"][0][4] == 2
    assert {r[0] for r in results["slowest tools"]} == {"calculator", "python"}
    assert len(results["slowest tool calls"]) == 10
    assert dict(results["span counts (stream)"])["tool"] == 2 * STEPS * SAMPLES * ROLLOUTS


def test_compacted_files_scan_as_a_dataset(results: dict[str, list[tuple[Any, ...]]]) -> None:
    """After rollout-trace compact, pyarrow.dataset + DuckDB count every tool call of every step."""
    assert results["tool calls by step (compacted dataset)"] == [(s, 2 * SAMPLES * ROLLOUTS) for s in range(STEPS)]
