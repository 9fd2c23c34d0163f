"""token2text, truncation and store_full_token with a real Hugging Face tokenizer built locally."""

from __future__ import annotations

import array
import dataclasses
import json

import numpy as np
import pytest
import torch
from tracer_fixtures import hf_tokenizer, tokenizer_dir

import tracer

TEXT = "How many clips did Natalia sell altogether in April and May?"


@dataclasses.dataclass
class TokenOutput:
    token_ids: list[int]
    log_probs: list[float]


class Server:
    """verl-style: the tokenizer lives on self."""

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer

    @tracer.rollout_trace_op(kind="llm")
    async def generate(self, prompt_ids: list[int], sampling_params: dict) -> TokenOutput:
        return TokenOutput(token_ids=list(prompt_ids[:5]), log_probs=[-0.5] * 5)


def record_one(tok: object, ids: object) -> dict:
    import asyncio

    asyncio.run(Server(tok).generate(ids, {"temperature": 1.0}))
    tracer.flush()
    return tracer.read_spans(tracer.get_config().run_dir).to_pylist()[-1]


def test_token2text_uses_self_tokenizer_like_verl(trace_dir: str) -> None:
    """Without a configured tokenizer, the method's self.tokenizer decodes prompt_ids and token_ids."""
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    tracer.init(output_dir=trace_dir, token2text=True)
    row = record_one(tok, ids)
    inputs, outputs = json.loads(row["inputs"]), json.loads(row["outputs"])
    assert inputs["prompt_ids"] == ids and inputs["prompt_text"] == tok.decode(ids) == TEXT
    assert outputs["token_text"] == tok.decode(ids[:5]) and outputs["__type__"] == "TokenOutput"
    assert json.loads(row["attributes"])["tokens"] == {"prompt_ids": len(ids), "token_ids": 5}


@pytest.mark.parametrize("as_type", ["numpy", "torch", "tuple", "array"])
def test_token2text_with_configured_tokenizer_path_and_array_ids(trace_dir: str, as_type: str) -> None:
    """A tokenizer path in the config decodes ids given as numpy arrays, torch tensors, tuples or array.array."""
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    given = {
        "numpy": np.array(ids, dtype=np.int64),
        "torch": torch.tensor(ids),
        "tuple": tuple(ids),
        "array": array.array("q", ids),
    }[as_type]
    tracer.init(output_dir=trace_dir, token2text=True, tokenizer=tokenizer_dir())
    row = record_one(None, given)
    inputs = json.loads(row["inputs"])
    assert inputs["prompt_ids"] == ids and inputs["prompt_text"] == TEXT


def test_max_tokens_cuts_ids_and_text_and_records_length(trace_dir: str) -> None:
    """max_tokens keeps the first N ids, decodes only those, and records the original length."""
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    tracer.init(output_dir=trace_dir, token2text=True, tokenizer=tok, max_tokens=4)
    row = record_one(tok, ids)
    inputs = json.loads(row["inputs"])
    assert inputs["prompt_ids"] == ids[:4] and inputs["prompt_text"] == tok.decode(ids[:4])
    assert json.loads(row["attributes"])["rollout_trace.truncated"] == {"prompt_ids": len(ids), "token_ids": 5}


def test_store_full_token_false_keeps_text_only(trace_dir: str) -> None:
    """store_full_token=False drops id lists after decoding them."""
    tok = hf_tokenizer()
    tracer.init(output_dir=trace_dir, token2text=True, tokenizer=tok, store_full_token=False)
    row = record_one(tok, tok.encode(TEXT))
    inputs = json.loads(row["inputs"])
    assert "prompt_ids" not in inputs and inputs["prompt_text"] == TEXT


def test_extra_token_fields_and_nested_dicts(trace_dir: str) -> None:
    """token_fields names more id fields; ids nested in dicts and lists are found too."""
    tok = hf_tokenizer()
    tracer.init(output_dir=trace_dir, token2text=True, tokenizer=tok, token_fields=("obs_ids",))

    @tracer.rollout_trace_op
    def f(batch: list[dict]) -> dict:
        return {"obs_ids": tok.encode("clips"), "n": 1}

    f([{"input_ids": tok.encode("April")}, {"input_ids": tok.encode("May")}])
    tracer.flush()
    row = tracer.read_spans(trace_dir).to_pylist()[0]
    assert [d["input_text"] for d in json.loads(row["inputs"])["batch"]] == ["April", "May"]
    assert json.loads(row["outputs"])["obs_text"] == "clips"


def test_token_fields_must_end_in_ids() -> None:
    """A token field that does not end in _ids is rejected with the rule."""
    with pytest.raises(tracer.TraceConfigError, match="ending in '_ids'"):
        tracer.TraceConfig(token_fields=("tokens",))
