"""A small recorded run for the viewer's tests, made with tracer's public API.

Several steps, groups of rollouts per prompt, tool calls (one failing with a
traceback), rewards with advantages, an llm span recorded without token2text
(response ids and per-token logprobs only, truncated), a validation rollout,
and model text that tries to inject HTML and markdown.
"""

from __future__ import annotations

import os

from export_fixtures import tool_call_messages

import tracer

PROJECT = "viewer-test"
EXPERIMENT = "run1"
#: Text a model might write that must be shown literally, never rendered.
HOSTILE_TEXT = "<script>alert('x')</script> **not bold** <b>raw</b>"
#: A word that appears only in one trajectory's conversation (step 2, sample 1, rollout 3).
NEEDLE = "zebracorn"


@tracer.rollout_trace_op(kind="llm", name="generate")
def _generate(prompt_ids: list[int], turn: int, rollout_n: int) -> dict:
    ids = [100 + turn * 10 + k for k in range(12)]
    return {
        "response_ids": ids,
        "logprobs": [-0.05 * k for k in range(12)],
        "finish_reason": "stop" if turn else "tool_calls",
    }


@tracer.rollout_trace_op(kind="tool", name="calculator")
def _calculator(expression: str) -> str:
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - a fixed test expression


@tracer.rollout_trace_op(kind="tool", name="search")
def _search(query: str) -> str:
    return f"results for {query}"


@tracer.rollout_trace_op(kind="rollout", name="agent_loop")
def _agent_loop(question: str, step: int, sample: int, rollout_n: int, crash: bool = False) -> dict:
    """The viewer's calculator agent: kept apart from ``export_fixtures.calculator_agent`` on purpose.

    It has the shapes the viewer's pages and its browser tests look for and
    the exporters' loop has not: a second tool (``search``), a third turn for
    rollout 3, model text that tries to inject HTML (rollout 0), a word found
    in one trajectory only (:data:`NEEDLE`), a rollout that raises, and
    12-token responses that ``max_tokens=8`` truncates. Its arguments (step,
    crash; rollout_n on every llm call) are recorded as the spans' inputs the
    viewer shows, so folding both loops into one would change either run's data.
    """
    messages: list[dict] = [
        {"role": "system", "content": "You are a careful calculator agent."},
        {"role": "user", "content": question},
    ]
    _generate([1, 2, 3], 0, rollout_n)
    if crash:
        raise RuntimeError("validation rollout crashed")
    expr = "1/0" if rollout_n == 1 else f"{sample} + {rollout_n}"
    tool = "calculator" if sample % 2 == 0 or rollout_n < 2 else "search"
    try:
        result = _calculator(expr) if tool == "calculator" else _search(expr)
    except ZeroDivisionError as exc:
        result = f"error: {exc}"
    messages += tool_call_messages(tool, expr, result)
    _generate([1, 2, 3, 4], 1, rollout_n)
    if rollout_n == 3:  # one more turn: the 4th rollout of every group has 3 turns
        messages.append({"role": "assistant", "content": "Let me double-check."})
        _generate([1, 2, 3, 4, 5], 2, rollout_n)
    answer = HOSTILE_TEXT if rollout_n == 0 else f"The answer is {result}."
    if (step, sample, rollout_n) == (2, 1, 3):
        answer += f" {NEEDLE}"
    messages.append({"role": "assistant", "content": answer})
    return {"messages": messages, "answer": answer, "num_turns": 2, "stop_reason": "stop"}


def record_run(
    output_dir: str | os.PathLike[str], steps: int = 3, prompts: int = 2, group: int = 4, experiment: str = EXPERIMENT
) -> str:
    """Record a small run under ``output_dir`` and return the run's directory.

    Step ``s`` (1-based), prompt ``p`` and rollout ``n`` get reward
    ``(n + s) % 2`` and the group-normalised advantage. Also records one
    validation rollout per step; the last step's validation rollout raises
    (status error). Rollout 3 of every group takes 3 turns, the others 2.
    """
    cfg = tracer.init(
        project_name=PROJECT,
        experiment_name=experiment,
        backend="arrow",
        output_dir=os.fspath(output_dir),
        max_tokens=8,
        flush_interval_s=0.2,
    )
    for step in range(1, steps + 1):
        for sample in range(prompts):
            rewards = [float((n + step) % 2) for n in range(group)]
            mean = sum(rewards) / group
            for n in range(group):
                with tracer.rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                    _agent_loop(f"What is {sample} + {n}?", step, sample, n)
                    tracer.log_reward(rewards[n], advantage=rewards[n] - mean, acc=rewards[n])
        with tracer.rollout_trace_attr(sample_index=100, step=step, rollout_n=0, validate=True):
            try:
                _agent_loop("Validation: what is 2 + 2?", step, 100, 0, crash=step == steps)
            except RuntimeError:
                pass
            tracer.log_reward(1.0)
    tracer.flush()
    tracer.shutdown()
    return cfg.run_dir


def write_tokenizer(folder: str | os.PathLike[str]) -> str:
    """A tiny word-level tokenizer.json whose ids 100-129 are the words ``w100``..``w129``; returns its path."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(100, 130)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    path = os.path.join(os.fspath(folder), "tokenizer.json")
    tok.save(path)
    return path


@tracer.rollout_trace_op(kind="tool", name="lookup")
def _lookup(i: int) -> str:
    return f"item {i}"


@tracer.rollout_trace_op(kind="llm", name="generate_long")
def _generate_long(n: int) -> dict:
    return {"response_ids": list(range(n)), "logprobs": [-0.001 * k for k in range(n)], "finish_reason": "length"}


@tracer.rollout_trace_op(kind="rollout", name="long_loop")
def _long_loop(tool_calls: int, tokens: int) -> dict:
    for i in range(tool_calls):
        _lookup(i)
    _generate_long(tokens)
    return {"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "done"}]}


def record_long_trajectory(output_dir: str | os.PathLike[str], tool_calls: int = 400, tokens: int = 5000) -> str:
    """Record one trajectory with many tool spans and a long llm response; return the run's directory."""
    cfg = tracer.init(project_name=PROJECT, experiment_name="long", backend="arrow", output_dir=os.fspath(output_dir))
    with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=0):
        _long_loop(tool_calls, tokens)
    tracer.flush()
    tracer.shutdown()
    return cfg.run_dir
