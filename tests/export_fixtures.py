"""A small recorded run for the exporter tests, made with tracer's public API.

Three steps of two prompts with groups of four rollouts, three validation
rollouts per step; llm spans with prompt/response token ids (no tokenizer: the
ids are kept, no text), tool spans of which one per group fails, and
``log_reward`` with an advantage. The rollout root returns ``{"messages": ...}``
(the conversation convention).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest

import tracer
from tracer.exporters import lag

PROJECT = "export-test"
EXPERIMENT = "run1"
STEPS = (1, 2, 3)
PROMPTS = 2
GROUP = 4
VAL_PER_STEP = 3
#: Training trajectories per step.
TRAIN_PER_STEP = PROMPTS * GROUP
#: Generous wait for a live exporter's thread on a loaded machine (not a timing assertion).
WAIT_S = 60.0


def tool_call_messages(tool: str, expression: str, result: str) -> list[dict[str, Any]]:
    """The chat messages of one tool turn: the assistant calls ``tool`` on ``expression`` (id ``call_0``), it answers ``result``.

    Shared by the calculator agents of these fixtures and the viewer's (``viewer_fixtures``).
    """
    call = {"name": tool, "arguments": f'{{"expression": "{expression}"}}'}
    return [
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [{"id": "call_0", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "call_0", "name": tool, "content": result},
    ]


def calculator_agent(
    first_id: int, llm_fields: Callable[[int], dict[str, Any]], second_prompt: list[int]
) -> Callable[[str, int, int], dict[str, Any]]:
    """The scripted two-turn calculator agent loop of the exporter fixtures (this module's and the MLflow one's).

    ``loop(question, sample, rollout_n)``: turn 0 calls the calculator on
    ``sample+rollout_n`` (rollout 1's call divides by zero and fails), turn 1
    answers; the root returns ``{"messages": ...}``. Each llm call returns six
    ids ``first_id + 10 * turn + k``, then ``llm_fields(turn)``; turn 1's
    prompt is ``second_prompt``. The knobs are closed over, not passed: the
    traced functions record only ``(prompt_ids, turn)``, ``(expression)`` and
    ``(question, sample, rollout_n)``.
    """

    @tracer.rollout_trace_op(kind="llm", name="generate")
    def generate(prompt_ids: list[int], turn: int) -> dict[str, Any]:
        ids = [first_id + turn * 10 + k for k in range(6)]
        return {"response_ids": ids, **llm_fields(turn), "finish_reason": "stop" if turn else "tool_calls"}

    @tracer.rollout_trace_op(kind="tool", name="calculator")
    def calculator(expression: str) -> str:
        if "/0" in expression:
            raise ZeroDivisionError("division by zero")
        return str(sum(int(x) for x in expression.split("+")))

    @tracer.rollout_trace_op(kind="rollout", name="agent_loop")
    def agent_loop(question: str, sample: int, rollout_n: int) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a calculator agent."},
            {"role": "user", "content": question},
        ]
        generate([1, 2, 3], 0)
        expr = "1/0" if rollout_n == 1 else f"{sample}+{rollout_n}"
        try:
            result = calculator(expr)
        except ZeroDivisionError as exc:
            result = f"error: {exc}"
        messages += tool_call_messages("calculator", expr, result)
        generate(second_prompt, 1)
        answer = f"The answer is {result}."
        messages.append({"role": "assistant", "content": answer})
        return {"messages": messages, "answer": answer, "num_turns": 2, "stop_reason": "stop"}

    return agent_loop


#: This module's loop: response text kept with the ids (no tokenizer), no logprobs.
_agent_loop = calculator_agent(200, lambda turn: {"response_text": f"turn {turn} text"}, [1, 2, 3, 4])


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


def init_console(output_dir: str | os.PathLike[str], print_lines: bool = True) -> tracer.TraceConfig:
    """Trace into ``output_dir`` with the live console backend (flushing every 0.1 s); ``print_lines`` also on stderr."""
    return tracer.init(
        project_name=PROJECT,
        experiment_name=EXPERIMENT,
        backend=["console"],
        output_dir=os.fspath(output_dir),
        flush_interval_s=0.1,
        **({} if print_lines else {"backend_options": {"console_print": False}}),
    )


def lag_on_every_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """Live drivers look at their queues and rewrite their lag files after every cycle (no 1 s / 5 s spacing)."""
    monkeypatch.setattr(lag, "WRITE_EVERY_S", 0.0)
    monkeypatch.setattr(lag, "OBSERVE_EVERY_S", 0.0)


def wait_for_lag(run_dir: str, predicate: Callable[[lag.LagRecord], bool], timeout: float = WAIT_S) -> lag.LagRecord:
    """The first lag record under ``run_dir`` matching ``predicate``, polled for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in lag.read_lag(run_dir) if predicate(r)]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no lag record matched within {timeout} s: {lag.read_lag(run_dir)}")
        time.sleep(0.05)


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
