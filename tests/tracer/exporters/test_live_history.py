"""Live export gets multi-turn prompt_ids whole, as the files' readers do (tracer/storage/history.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import pytest

import tracer
from tracer import schema as S
from tracer.backends import BACKENDS, Backend
from tracer.exporters import SinkBase, StepBatch, Target, Written

#: Prompt id lists of the llm spans the sink was handed, in start order.
PROMPTS: list[list[Any]] = []


class PromptSink(SinkBase):
    """Keeps the prompt_ids of every llm span it is handed."""

    span_columns: ClassVar[tuple[str, ...]] = (S.KIND, S.START_NS, S.INPUTS)

    def write(self, batch: StepBatch) -> Written:
        for t in batch.trajectories:
            llm = sorted((s for s in t.spans if s[S.KIND] == S.KIND_LLM), key=lambda s: s[S.START_NS])
            PROMPTS.extend(json.loads(s[S.INPUTS])["prompt_ids"] for s in llm)
        return Written(sent=len(batch.trajectories))

    def open(self, target: Target) -> set[str]:
        return set()


@tracer.rollout_trace_op(kind="llm")
async def generate(prompt_ids: list[int]) -> dict:
    return {"response_ids": [len(prompt_ids), 1, 2]}


def test_a_live_sink_sees_every_turn_whole(trace_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Later turns are references in the file; the live driver hands the sink the whole lists."""
    PROMPTS.clear()
    monkeypatch.setitem(BACKENDS, "prompts", Backend("prompts", f"{__name__}:PromptSink"))
    tracer.init(output_dir=trace_dir, backend=["prompts"])
    sent = []

    async def agent() -> None:
        with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=0):
            history = list(range(64))
            for t in range(4):
                sent.append(list(history))
                out = await generate(list(history))
                history = history + out["response_ids"] + [100 + t]

    asyncio.run(agent())
    assert tracer.shutdown().ok
    raw = [r for _, b in tracer.iter_batches(trace_dir) for r in b.to_pylist() if r[S.KIND] == S.KIND_LLM]
    assert sum(isinstance(json.loads(r[S.INPUTS])["prompt_ids"], dict) for r in raw) == 3
    assert sent == PROMPTS
