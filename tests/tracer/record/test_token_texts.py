"""Per-token text with token2text: each response token's own text is recorded beside its id (issue 17)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracer_fixtures import hf_tokenizer

import tracer
from tracer.record.pieces import PieceTable, batch_decode, piece_table
from tracer.summary import span_turns


@functools.lru_cache(maxsize=1)
def shared_tokenizer() -> Any:
    """One loaded tokenizer for the property tests (loading it per example would dominate)."""
    return hf_tokenizer()


TEXT = "How many clips did Natalia sell? 中文 and 🎉 too."


@dataclasses.dataclass
class TokenOutput:
    token_ids: list[int]
    log_probs: list[float]


class Engine:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @tracer.rollout_trace_op(kind="llm")
    async def generate(self, prompt_ids: list[int], response: list[int]) -> dict:
        return {"response_ids": response, "finish_reason": "stop"}

    @tracer.rollout_trace_op(kind="llm")
    async def verl_generate(self, prompt_ids: list[int], response: list[int]) -> TokenOutput:
        return TokenOutput(token_ids=response, log_probs=[-0.1] * len(response))


def record(trace_dir: str, tok: Any, prompt: list[int], response: list[int], verl: bool = False, **config: Any) -> dict:
    tracer.init(output_dir=trace_dir, token2text=True, tokenizer=tok, **config)
    engine = Engine(tok)
    call = engine.verl_generate if verl else engine.generate
    asyncio.run(call(prompt, response))
    assert tracer.flush().ok
    return tracer.read_spans(trace_dir).to_pylist()[-1]


def test_response_tokens_get_their_own_text_and_prompt_tokens_do_not(trace_dir: str) -> None:
    """response_ids gain response_token_texts (one per id, joined = response_text); prompt_ids only prompt_text."""
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    row = record(trace_dir, tok, ids[:5], ids)
    out, inputs = json.loads(row["outputs"]), json.loads(row["inputs"])
    assert len(out["response_token_texts"]) == len(ids)
    assert "".join(out["response_token_texts"]) == out["response_text"] == TEXT
    assert "prompt_token_texts" not in inputs and inputs["prompt_text"] == tok.decode(ids[:5])


def test_split_characters_go_to_the_token_holding_their_last_byte() -> None:
    """A byte-level token that is part of a character shows "", the token completing it shows the character."""
    tok = hf_tokenizer()
    ids = tok.encode("中")
    assert len(ids) > 1  # the small vocabulary splits it into bytes
    pieces = piece_table(tok).pieces(ids, tok)
    assert pieces == [""] * (len(ids) - 1) + ["中"]


def test_verl_token_output_gets_token_texts_and_the_turn_shows_them(trace_dir: str) -> None:
    """verl's TokenOutput.token_ids gain token_texts; the trajectory model's turn carries them."""
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    row = record(trace_dir, tok, ids[:3], ids, verl=True)
    out = json.loads(row["outputs"])
    assert out["token_texts"] == piece_table(tok).pieces(ids, tok)
    turn = next(t for t in span_turns(tracer.read_spans(trace_dir)) if t.role == "assistant")
    assert list(turn.token_texts) == out["token_texts"] and list(turn.token_ids) == ids


def test_store_full_token_false_keeps_per_token_text(trace_dir: str) -> None:
    """Without the id lists, each token's text is still there (the grid can show it)."""
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    out = json.loads(record(trace_dir, tok, ids[:3], ids, store_full_token=False)["outputs"])
    assert "response_ids" not in out and "".join(out["response_token_texts"]) == TEXT


def test_max_tokens_cuts_the_per_token_texts_too(trace_dir: str) -> None:
    """max_tokens keeps as many token texts as ids."""
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    out = json.loads(record(trace_dir, tok, ids[:3], ids, max_tokens=4)["outputs"])
    assert out["response_ids"] == ids[:4] and len(out["response_token_texts"]) == 4


def test_a_secret_split_over_tokens_is_redacted_from_the_token_texts(trace_dir: str) -> None:
    """A key that no single token holds is still caught: the pieces are redacted as the text they spell."""
    tok = hf_tokenizer()
    secret = "sk-" + "abcdEFGH1234ijklMNOP5678qrst"
    ids = tok.encode(f"the key is {secret} ok")
    out = json.loads(record(trace_dir, tok, ids[:2], ids)["outputs"])
    joined = "".join(out["response_token_texts"])
    assert secret not in joined and "abcdEFGH1234" not in joined
    assert joined == out["response_text"] == "the key is <redacted> ok"
    assert len(out["response_token_texts"]) == len(ids)


class WordTokenizer:
    """A tokenizer with only ``decode`` (no table): per-token texts come from decoding each id alone."""

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)


def test_a_tokenizer_without_a_vocabulary_table_decodes_each_id_alone(trace_dir: str) -> None:
    """Any object with a decode method gets per-token texts, one decode per distinct id (remembered)."""
    out = json.loads(record(trace_dir, WordTokenizer(), [1], [5, 6, 5])["outputs"])
    assert out["response_token_texts"] == ["w5", "w6", "w5"] and out["response_text"] == "w5 w6 w5"


def test_ids_outside_the_vocabulary_do_not_break_the_span(trace_dir: str) -> None:
    """Negative or too-large ids still give one text per id; the span is written."""
    tok = hf_tokenizer()
    out = json.loads(record(trace_dir, tok, [1], [-1, 10**6, 5])["outputs"])
    assert len(out["response_token_texts"]) == 3 and out["response_ids"] == [-1, 10**6, 5]


def test_the_table_reproduces_the_tokenizer_text_for_the_qwen_vocabulary(qwen_tokenizer: Any) -> None:
    """For the 151k-token Qwen vocabulary the byte table decodes exactly what the tokenizer decodes."""
    table = PieceTable(qwen_tokenizer)
    assert table.exact_text and len(table.bytes) >= 151643
    ids = qwen_tokenizer.encode("<|im_start|>user\nhéllo 中文 🎉 <think>ok</think><|im_end|>")
    assert table.decode(ids) == batch_decode(qwen_tokenizer, [ids])[0]
    assert "".join(table.pieces(ids, qwen_tokenizer)) == table.decode(ids)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(min_value=0, max_value=399), max_size=64))
def test_any_id_sequence_gets_one_text_per_id_spelling_its_decoded_text(ids: list[int]) -> None:
    """Property: for a byte-level BPE, pieces are one per id and join to the tokenizer's decoded text."""
    tok = shared_tokenizer()
    table = piece_table(tok)
    pieces = table.pieces(ids, tok)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == batch_decode(tok, [ids])[0] == table.decode(ids)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=40))
def test_any_text_encoded_then_split_joins_back(text: str) -> None:
    """Property: any unicode text, encoded, gives pieces whose join is the decoded text."""
    tok = shared_tokenizer()
    ids = tok.encode(text)
    assert "".join(piece_table(tok).pieces(ids, tok)) == tok.decode(ids)


@pytest.mark.parametrize("n", [1, 3])
def test_redacting_pieces_keeps_one_text_per_token(n: int) -> None:
    """Redaction of pieces keeps their count and the text around the secret where it was."""
    from tracer.record.redact import Redactor

    secret = "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ12"
    cut = [len(secret) * i // n for i in range(n + 1)]
    pieces = ["before ", *[secret[a:b] for a, b in zip(cut, cut[1:])], " after"]
    out = Redactor().pieces(pieces)
    assert len(out) == len(pieces) and out[0] == "before " and out[-1] == " after"
    assert "".join(out) == "before <redacted> after"
