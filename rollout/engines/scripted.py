"""A deterministic scripted policy: plausible tool-using turns, no model.

**This engine is scripted, not a language model.** It reads the problem out
of the prompt, looks up the problem's solution expression, and writes one of
several fixed behaviours, chosen by the rollout's seed: a correct answer via
the calculator or Python, a wrong expression, a malformed tool call then a
recovery, buggy code then a fix, a call to a tool that does not exist, a
guess without tools, or a loop of tool calls that runs out of turns. Its text
goes through the same tokenizer, agent loop, tools and tracer as a real
model's, so the demo and the tests exercise everything but the model. It
gives no logprobs.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Iterable, Mapping
from typing import Any

from rollout.engines import Generation, SamplingParams

#: Behaviours and their weights when sampling (temperature > 0).
BEHAVIOURS: dict[str, float] = {
    "calculator": 0.30,
    "python": 0.15,
    "wrong_expression": 0.15,
    "malformed_call": 0.10,
    "buggy_code": 0.10,
    "unknown_tool": 0.06,
    "guess": 0.08,
    "tool_loop": 0.06,
}
#: Behaviours under greedy decoding (validation): mostly right, some wrong.
GREEDY_BEHAVIOURS: dict[str, float] = {"calculator": 0.5, "python": 0.3, "wrong_expression": 0.2}

_INTROS = (
    "I need to compute {expr}. Let me use the {tool} tool.",
    "Let me set this up: the total is {expr}. I'll check it with the {tool} tool.",
    "The quantities combine as {expr}. I'll let the {tool} tool do the arithmetic.",
)


def _call(name: str, arguments: Mapping[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": dict(arguments)}) + "\n</tool_call>"


def _perturb(expr: str) -> str:
    """A plausible wrong expression: one operator swapped, or an off-by-one."""
    for old, new in ((" + ", " - "), (" * ", " + "), (" - ", " + "), (" / ", " * ")):
        if old in expr:
            return expr.replace(old, new, 1)
    return f"{expr} + 1"


class ScriptedEngine:
    """Scripted policy engine (``--engine scripted``): deterministic, model-free.

    Args:
        tokenizer: Encodes the scripted text and decodes prompts; its
            end-of-turn token ends every turn.
        problems: Problems with ``question`` and ``expression``; the engine
            recognises them in the prompt.
        latency_per_token_s: Simulated generation time per token (0: none).
        eos_token: The end-of-turn token text.
    """

    name = "scripted"

    def __init__(
        self,
        tokenizer: Any,
        problems: Iterable[Mapping[str, Any]],
        latency_per_token_s: float = 0.0,
        eos_token: str = "<|im_end|>",
    ):
        self.tokenizer = tokenizer
        self.problems = {str(p["question"]): dict(p) for p in problems}
        self.latency_per_token_s = latency_per_token_s
        self.eos_token = eos_token
        self.eos_id = tokenizer.convert_tokens_to_ids(eos_token)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Write the next scripted turn for the conversation in ``prompt_ids``."""
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        text = self.next_turn(prompt, sampling)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        finish = "stop"
        if len(ids) + 1 > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], "length"
        else:
            ids.append(self.eos_id)
        if self.latency_per_token_s > 0:
            await asyncio.sleep(self.latency_per_token_s * len(ids))
        return Generation(ids, None, finish)

    async def close(self) -> None:
        """Nothing to release."""

    # -- the script ----------------------------------------------------

    def _problem(self, prompt: str) -> dict[str, Any] | None:
        for question, problem in self.problems.items():
            if question in prompt:
                return problem
        return None

    def _behaviour(self, question: str, sampling: SamplingParams) -> tuple[str, random.Random]:
        table = GREEDY_BEHAVIOURS if sampling.greedy else BEHAVIOURS
        seed = 0 if sampling.greedy or sampling.seed is None else sampling.seed
        rng = random.Random(f"{seed}|{question}")
        names = list(table)
        return rng.choices(names, weights=[table[n] for n in names])[0], rng

    def next_turn(self, prompt: str, sampling: SamplingParams) -> str:
        """The scripted text of the next assistant turn (without the end token)."""
        problem = self._problem(prompt)
        if problem is None:
            return "I could not find a problem I know in this conversation, so I will guess. The answer is \\boxed{0}."
        behaviour, rng = self._behaviour(problem["question"], sampling)
        turn = max(prompt.count("<|im_start|>assistant") - 1, 0)
        responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, flags=re.DOTALL)
        last = responses[-1].strip() if responses else ""
        expr = str(problem["expression"])
        intro = rng.choice(_INTROS)
        steps = self._script(behaviour, expr, str(problem["answer"]), intro, rng)
        if turn < len(steps) - 1:
            return steps[turn]
        if behaviour == "tool_loop":
            return f"Let me double-check that result of {last} once more.\n" + _call(
                "calculator", {"expression": f"{expr} * 1"}
            )
        if behaviour == "guess":
            return steps[-1]
        if last.startswith("Error"):
            return f"The tool failed ({last[:80]}). I am not sure, but my best estimate is \\boxed{{{problem['answer']}0}}."
        return f"The tool returned {last}, so the answer is \\boxed{{{last}}}."

    @staticmethod
    def _script(behaviour: str, expr: str, answer: str, intro: str, rng: random.Random) -> list[str]:
        """Turns before the final answer; the last element is a placeholder for the answer turn."""
        calc = _call("calculator", {"expression": expr})
        code = f"result = {expr}\nprint(result)"
        if behaviour == "calculator":
            return [intro.format(expr=expr, tool="calculator") + "\n" + calc, ""]
        if behaviour == "python":
            return [intro.format(expr=expr, tool="python") + "\n" + _call("python", {"code": code}), ""]
        if behaviour == "wrong_expression":
            wrong = _perturb(expr)
            return [intro.format(expr=wrong, tool="calculator") + "\n" + _call("calculator", {"expression": wrong}), ""]
        if behaviour == "malformed_call":
            broken = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + expr + '"}\n</tool_call>'
            return [
                intro.format(expr=expr, tool="calculator") + "\n" + broken,
                "My tool call was malformed. Let me fix the JSON.\n" + calc,
                "",
            ]
        if behaviour == "buggy_code":
            buggy = f"total = {expr}\nprint(totl)"
            return [
                intro.format(expr=expr, tool="python") + "\n" + _call("python", {"code": buggy}),
                "I misspelled the variable name. Fixed:\n" + _call("python", {"code": code}),
                "",
            ]
        if behaviour == "unknown_tool":
            return [
                "Let me look this up.\n" + _call("search", {"query": "answer to this word problem"}),
                "There is no search tool; I'll compute it instead.\n" + calc,
                "",
            ]
        if behaviour == "guess":
            guess = answer if rng.random() < 0.4 else str(int(float(answer)) + rng.choice((-10, -1, 1, 2, 10)))
            return [f"This looks simple enough to do in my head. The answer is \\boxed{{{guess}}}."]
        if behaviour == "tool_loop":
            return [intro.format(expr=expr, tool="calculator") + "\n" + calc, ""]
        raise ValueError(f"unknown scripted behaviour {behaviour!r}")
