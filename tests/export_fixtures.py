"""A small recorded run for the exporter tests, made with tracer's public API.

Three steps of two prompts with groups of four rollouts, three validation
rollouts per step; llm spans with prompt/response token ids (no tokenizer: the
ids are kept, no text), tool spans of which one per group fails, and
``log_reward`` with an advantage. The rollout root returns ``{"messages": ...}``
(the conversation convention).
"""

from __future__ import annotations

import os
from typing import Any

import tracer

PROJECT = "export-test"
EXPERIMENT = "run1"
STEPS = (1, 2, 3)
PROMPTS = 2
GROUP = 4
VAL_PER_STEP = 3
#: Training trajectories per step.
TRAIN_PER_STEP = PROMPTS * GROUP


@tracer.rollout_trace_op(kind="llm", name="generate")
def _generate(prompt_ids: list[int], turn: int) -> dict[str, Any]:
    ids = [200 + turn * 10 + k for k in range(6)]
    return {
        "response_ids": ids,
        "response_text": f"turn {turn} text",
        "finish_reason": "stop" if turn else "tool_calls",
    }


@tracer.rollout_trace_op(kind="tool", name="calculator")
def _calculator(expression: str) -> str:
    if "/0" in expression:
        raise ZeroDivisionError("division by zero")
    a, b = expression.split("+")
    return str(int(a) + int(b))


@tracer.rollout_trace_op(kind="rollout", name="agent_loop")
def _agent_loop(question: str, sample: int, rollout_n: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a calculator agent."},
        {"role": "user", "content": question},
    ]
    _generate([1, 2, 3], 0)
    expr = "1/0" if rollout_n == 1 else f"{sample}+{rollout_n}"
    messages.append(
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": f'{{"expression": "{expr}"}}'},
                }
            ],
        }
    )
    try:
        result = _calculator(expr)
    except ZeroDivisionError as exc:
        result = f"error: {exc}"
    messages.append({"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": result})
    _generate([1, 2, 3, 4], 1)
    answer = f"The answer is {result}."
    messages.append({"role": "assistant", "content": answer})
    return {"messages": messages, "answer": answer, "num_turns": 2, "stop_reason": "stop"}


def reward_of(step: int, sample: int, rollout_n: int) -> float:
    """The reward the fixture logs for a training rollout."""
    return float((rollout_n + step + sample) % 2) + 0.25 * sample


def record_rollouts(steps: tuple[int, ...] = STEPS, val_per_step: int = VAL_PER_STEP) -> None:
    """Record the rollouts into whatever tracer is configured (no init, no shutdown)."""
    for step in steps:
        for sample in range(PROMPTS):
            rewards = [reward_of(step, sample, n) for n in range(GROUP)]
            mean = sum(rewards) / GROUP
            for n in range(GROUP):
                with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                    _agent_loop(f"What is {sample} + {n}?", sample, n)
                    tracer.log_reward(rewards[n], advantage=rewards[n] - mean)
        for v in range(val_per_step):
            with tracer.rollout_trace_attr(sample_index=100 + v, step=step, rollout_n=0, validate=True):
                _agent_loop(f"Validation {v}: what is 2 + 2?", 100 + v, 0)
                tracer.log_reward(1.0)


def record_run(output_dir: str | os.PathLike[str], **config: Any) -> str:
    """Record the fixture run under ``output_dir`` and return the run's directory."""
    cfg = tracer.init(
        project_name=PROJECT,
        experiment_name=EXPERIMENT,
        backend="arrow",
        output_dir=os.fspath(output_dir),
        flush_interval_s=0.2,
        **config,
    )
    record_rollouts()
    tracer.flush()
    tracer.shutdown()
    return cfg.run_dir


def wandb_env(monkeypatch: Any, root: str | os.PathLike[str]) -> str:
    """Point every wandb directory at ``root`` and force offline mode; return the run dir root."""
    base = os.fspath(root)
    for var, sub in (
        ("WANDB_DIR", ""),
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_CONFIG_DIR", "config"),
    ):
        path = os.path.join(base, sub)
        os.makedirs(path, exist_ok=True)
        monkeypatch.setenv(var, path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return base
