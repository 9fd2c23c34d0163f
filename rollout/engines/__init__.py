"""Generation engines behind one small interface.

An engine turns prompt token ids into response token ids (and per-token
logprobs when it can)::

    out = await engine.generate(prompt_ids, SamplingParams(temperature=1.0, max_new_tokens=256))
    out.token_ids, out.logprobs, out.finish_reason

Engines: ``scripted`` (a deterministic scripted policy, no model), ``hf``
(Hugging Face transformers on CPU), ``openai`` (an OpenAI-compatible
completions endpoint), ``vllm`` (vLLM's ``AsyncLLM``). :func:`create_engine`
builds one by name; each module is imported only when its engine is used.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one model turn.

    Attributes:
        temperature: 0 means greedy.
        top_p: Nucleus sampling mass.
        max_new_tokens: Most tokens this turn may generate.
        seed: Per-request seed, where the engine honours one.
        logprobs: Ask for the chosen tokens' logprobs.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    logprobs: bool = True

    @property
    def greedy(self) -> bool:
        """True when sampling is greedy (temperature 0)."""
        return self.temperature <= 0.0


@dataclasses.dataclass
class Generation:
    """One model turn.

    Attributes:
        token_ids: Generated token ids, including the stop token if one was hit.
        logprobs: Log-probability of each generated token under the model
            (before temperature/top-p), or None when the engine gives none.
        finish_reason: ``"stop"`` (an end-of-turn token) or ``"length"``
            (``max_new_tokens`` reached).
    """

    token_ids: list[int]
    logprobs: list[float] | None = None
    finish_reason: str = "stop"


@runtime_checkable
class Engine(Protocol):
    """What the agent loop needs from an inference engine."""

    #: Short name recorded with the run (e.g. ``"hf"``).
    name: str

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Continue ``prompt_ids`` by one model turn."""
        ...

    async def close(self) -> None:
        """Release the engine's resources (servers, threads, GPU memory)."""
        ...


#: Engine name -> "module:class", imported on use.
ENGINES: dict[str, str] = {
    "scripted": "rollout.engines.scripted:ScriptedEngine",
    "hf": "rollout.engines.hf:HFEngine",
    "openai": "rollout.engines.openai:OpenAIEngine",
    "vllm": "rollout.engines.vllm:VLLMEngine",
}


def engine_class(name: str) -> type:
    """The class of engine ``name``.

    Raises:
        ValueError: unknown name; lists the valid ones.
    """
    target = ENGINES.get(name)
    if target is None:
        raise ValueError(f"unknown engine {name!r}; valid engines are {', '.join(ENGINES)}")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def create_engine(name: str, **kwargs: Any) -> Engine:
    """Build engine ``name`` with ``kwargs`` (see each engine's class)."""
    return engine_class(name)(**kwargs)


__all__ = ["ENGINES", "Engine", "Generation", "SamplingParams", "create_engine", "engine_class"]
