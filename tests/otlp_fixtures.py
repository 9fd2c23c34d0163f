"""The OTLP export tests' run: a small tool-using run and its spans as the files hold them (servers: server_fixtures).

Shared by ``tests/tracer/exporters/test_export_otlp.py`` (a local receiver,
MLflow's OTLP endpoint) and ``test_otlp_phoenix.py`` (Arize Phoenix).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import tracer
from tracer import schema as S


@tracer.rollout_trace_op(kind="llm")
def generate(prompt_ids: list[int]) -> dict[str, Any]:
    """Two response tokens with logprobs."""
    return {"response_ids": [len(prompt_ids), 7], "logprobs": [-0.5, -0.1], "finish_reason": "stop"}


@tracer.rollout_trace_op(kind="tool")
def calculator(expression: str) -> str:
    """``42``, or ZeroDivisionError for an expression dividing by zero."""
    if "/ 0" in expression:
        raise ZeroDivisionError("division by zero")
    return "42"


def record_tool_run(
    output_dir: str | os.PathLike[str],
    project: str,
    steps: Sequence[int],
    samples: int = 2,
    advantage: bool = True,
) -> str:
    """Record ``samples`` prompts x 2 rollouts per step under ``output_dir``; return the run's directory.

    Each rollout: llm, tool (rollout 1's divides by zero and fails), llm; its
    reward ``n`` is logged after it by keys, with advantage ``n - 0.5`` when
    ``advantage``.
    """
    cfg = tracer.init(project_name=project, experiment_name="e", output_dir=os.fspath(output_dir))
    for step in steps:
        for sample in range(samples):
            for n in range(2):
                with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                    generate([1, 2, 3])
                    try:
                        calculator("1 / 0" if n else "6 * 7")
                    except ZeroDivisionError:
                        pass
                    generate([1, 2, 3, 4, 5])
                extra = {"advantage": n - 0.5} if advantage else {}
                tracer.log_reward(float(n), step=step, sample_index=sample, rollout_n=n, **extra)
    tracer.shutdown()
    return cfg.run_dir


def recorded_spans(run: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The run's span rows by (trace id, span id), less the reward summary spans (OTLP carries rewards on the root)."""
    rows = tracer.read_spans(run).to_pylist()
    return {
        (r[S.TRACE_ID], r[S.SPAN_ID]): r
        for r in rows
        if not (r[S.KIND] == S.KIND_REWARD and r[S.NAME] == S.REWARD_SPAN_NAME)
    }
