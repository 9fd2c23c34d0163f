"""The token grid shows the per-token text recorded with token2text, with no tokenizer at view time (issue 17)."""

from __future__ import annotations

import asyncio
import json
import os

from tracer_fixtures import hf_tokenizer, tokenizer_dir

import tracer
from tracer.record.pieces import token_texts_of
from viewer import data as D

TEXT = "Natalia sold 48 clips. 中文 ok"


class Engine:
    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer

    @tracer.rollout_trace_op(kind="llm")
    async def generate(self, prompt_ids: list[int], response: list[int]) -> dict:
        return {"response_ids": response, "logprobs": [-0.5] * len(response)}


def record(trace_dir: str, tokenizer: object) -> tuple[str, list[int]]:
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    tracer.init(output_dir=trace_dir, token2text=True, tokenizer=tokenizer)

    async def main() -> None:
        with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=0):
            await Engine(tok).generate(ids[:4], ids)

    asyncio.run(main())
    assert tracer.flush().ok
    run_dir = tracer.get_config().run_dir
    tracer.shutdown()
    return run_dir, ids


def recorded_texts(run_dir: str) -> list[str]:
    llm = [r for r in tracer.read_spans(run_dir).to_pylist() if r[tracer.schema.KIND] == tracer.schema.KIND_LLM]
    out = json.loads(llm[0][tracer.schema.OUTPUTS])
    texts = token_texts_of(out, "response_token_texts", "response_token_offsets", out["response_text"])
    assert texts is not None
    return texts


def test_the_grid_shows_recorded_token_texts_without_a_tokenizer(trace_dir: str) -> None:
    """Cells are labelled with each token's recorded text; no decoder is passed."""
    run_dir, ids = record(trace_dir, hf_tokenizer())
    spans = tracer.read_spans(run_dir)
    recorded = recorded_texts(run_dir)
    (turn,) = D.token_turns(spans)
    assert turn.token_ids == ids and turn.token_texts == recorded
    assert "".join(turn.token_texts) == TEXT
    tokens = [c["token"] for c in turn.cells()]
    assert tokens == [t.replace(" ", "\u00b7") for t in recorded]


def test_view_time_decoder_renders_tokens_as_the_recorder_does(trace_dir: str) -> None:
    """The tokenizer named by the run's config decodes each id into the same text the recorder keeps."""
    path = os.path.join(tokenizer_dir(), "tokenizer.json")
    run_dir, ids = record(trace_dir, path)
    assert D.run_tokenizer_path(run_dir) == path
    recorded = recorded_texts(run_dir)
    assert D.load_token_decoder(path)(ids) == recorded
