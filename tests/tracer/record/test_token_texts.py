"""Per-token text with token2text: one text per response token, as offsets into the decoded text where they spell it."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracer_fixtures import hf_tokenizer

import tracer
from tracer.record.pieces import NUMPY_DECODE_IDS, PieceTable, batch_decode, piece_table, split_text, token_texts_of
from tracer.record.redact import REDACTED, Redactor
from tracer.summary import span_turns, text_field_name, token_offsets_field_name, token_texts_field_name


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


def texts_of(out: dict, ids_field: str = "response_ids") -> list[str] | None:
    """Per-token texts of a span's outputs as stored (pieces, or offsets into the text)."""
    return token_texts_of(
        out, token_texts_field_name(ids_field), token_offsets_field_name(ids_field), out.get(text_field_name(ids_field))
    )


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
    assert len(texts_of(out)) == len(ids)
    assert "".join(texts_of(out)) == out["response_text"] == TEXT
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
    assert texts_of(out, "token_ids") == piece_table(tok).pieces(ids, tok)
    turn = next(t for t in span_turns(tracer.read_spans(trace_dir)) if t.role == "assistant")
    assert list(turn.token_texts) == texts_of(out, "token_ids") and list(turn.token_ids) == ids


def test_store_full_token_false_keeps_per_token_text(trace_dir: str) -> None:
    """Without the id lists, each token's text is still there (the grid can show it)."""
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    out = json.loads(record(trace_dir, tok, ids[:3], ids, store_full_token=False)["outputs"])
    assert "response_ids" not in out and "".join(texts_of(out)) == TEXT


def test_max_tokens_cuts_the_per_token_texts_too(trace_dir: str) -> None:
    """max_tokens keeps as many token texts as ids."""
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    out = json.loads(record(trace_dir, tok, ids[:3], ids, max_tokens=4)["outputs"])
    assert out["response_ids"] == ids[:4] and len(texts_of(out)) == 4


def test_a_secret_split_over_tokens_is_redacted_from_the_token_texts(trace_dir: str) -> None:
    """A key that no single token holds is still caught: the pieces are redacted as the text they spell."""
    tok = hf_tokenizer()
    secret = "sk-" + "abcdEFGH1234ijklMNOP5678qrst"
    ids = tok.encode(f"the key is {secret} ok")
    out = json.loads(record(trace_dir, tok, ids[:2], ids)["outputs"])
    joined = "".join(texts_of(out))
    assert secret not in joined and "abcdEFGH1234" not in joined
    assert joined == out["response_text"] == "the key is <redacted> ok"
    assert len(texts_of(out)) == len(ids)


class WordTokenizer:
    """A tokenizer with only ``decode`` (no table): per-token texts come from decoding each id alone."""

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)


def test_a_tokenizer_without_a_vocabulary_table_decodes_each_id_alone(trace_dir: str) -> None:
    """Any object with a decode method gets per-token texts, one decode per distinct id (remembered)."""
    out = json.loads(record(trace_dir, WordTokenizer(), [1], [5, 6, 5])["outputs"])
    assert texts_of(out) == ["w5", "w6", "w5"] and out["response_text"] == "w5 w6 w5"


def test_ids_outside_the_vocabulary_do_not_break_the_span(trace_dir: str) -> None:
    """Negative or too-large ids still give one text per id; the span is written."""
    tok = hf_tokenizer()
    out = json.loads(record(trace_dir, tok, [1], [-1, 10**6, 5])["outputs"])
    assert len(texts_of(out)) == 3 and out["response_ids"] == [-1, 10**6, 5]


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


# -- offsets into the decoded text ------------------------------------------

SECRET = "sk-" + "abcdEFGH1234ijklMNOP5678qrst"


def table_of(vocab: list[bytes]) -> PieceTable:
    """A byte-level piece table over ``vocab`` (as one built from a tokenizer whose bytes join exactly)."""
    table = PieceTable(None)
    table.use_bytes(vocab)
    table.exact_text = True
    return table


@st.composite
def vocab_and_ids(draw: Any) -> tuple[list[bytes], list[int]]:
    # Whole characters, bytes of split characters, stray bytes and the empty token.
    token = st.one_of(
        st.text(max_size=4).map(lambda t: t.encode("utf-8")),
        st.binary(max_size=3),
        st.sampled_from(["中".encode()[:1], "中".encode()[1:], "🎉".encode()[:2], "🎉".encode()[2:], b""]),
    )
    vocab = draw(st.lists(token, min_size=1, max_size=40))
    ids = draw(st.lists(st.integers(min_value=0, max_value=len(vocab) - 1), max_size=60))
    return vocab, ids


@settings(max_examples=300, deadline=None)
@given(case=vocab_and_ids())
def test_offsets_cut_the_decoded_text_into_todays_pieces(case: tuple[list[bytes], list[int]]) -> None:
    """Property: for any piece table and ids, the offsets cut the decoded text into exactly the pieces."""
    vocab, ids = case
    table = table_of(vocab)
    text = table.decode(ids)
    ends = table.ends(ids, None, text)
    pieces = table.pieces(ids, None)
    assert "".join(pieces) == text
    assert ends is not None and split_text(text, ends.tolist()) == pieces


def test_pieces_that_do_not_spell_the_text_are_stored_as_texts(trace_dir: str) -> None:
    """A decoder whose pieces do not join to its text keeps the old layout: one string per token."""
    out = json.loads(record(trace_dir, WordTokenizer(), [1], [5, 6])["outputs"])
    assert out["response_token_texts"] == ["w5", "w6"] and "response_token_offsets" not in out


def test_a_byte_level_response_stores_offsets_not_strings(trace_dir: str) -> None:
    """A byte-level tokenizer's response gets one end offset per token and no per-token strings."""
    tok = hf_tokenizer()
    ids = tok.encode(TEXT)
    out = json.loads(record(trace_dir, tok, ids[:3], ids)["outputs"])
    assert "response_token_texts" not in out and len(out["response_token_offsets"]) == len(ids)
    assert out["response_token_offsets"][-1] == len(TEXT) and "".join(texts_of(out)) == TEXT


@st.composite
def text_with_secret(draw: Any, within_one_token: bool) -> tuple[list[str], int, int]:
    """Pieces spelling ``before + SECRET + after``, and where the secret starts and ends."""
    before = draw(st.text(alphabet=" abcdef.\n", max_size=12))
    after = draw(st.text(alphabet=" abcdef.\n", max_size=12))
    text = f"{before} {SECRET} {after}"
    lo, hi = len(before) + 1, len(before) + 1 + len(SECRET)
    if within_one_token:
        cuts = [c for c in draw(st.lists(st.integers(0, len(text)), max_size=8)) if not lo - 1 < c < hi + 1]
    else:
        inner = draw(st.lists(st.integers(lo + 1, hi - 1), min_size=1, max_size=6))
        cuts = inner + draw(st.lists(st.integers(0, len(text)), max_size=6))
    cuts = sorted({0, len(text), *cuts})
    return [text[a:b] for a, b in zip(cuts, cuts[1:])], lo, hi


def check_masked(pieces: list[str], lo: int, hi: int) -> None:
    text = "".join(pieces)
    ends = [len("".join(pieces[: k + 1])) for k in range(len(pieces))]
    clean, moved = Redactor().text_and_ends(text, ends)
    clean_too, moved_array = Redactor().text_and_ends(text, np.array(ends, dtype=np.int64))
    assert clean_too == clean and moved_array.tolist() == moved  # a numpy array of offsets moves the same
    out = split_text(clean, moved)
    assert out is not None and len(out) == len(pieces) and "".join(out) == clean
    assert SECRET not in clean and REDACTED in clean
    assert out == Redactor().pieces(pieces)
    starts = [0, *ends[:-1]]
    for piece, new, a, b in zip(pieces, out, starts, ends):
        if b <= lo - 1 or a >= hi + 1:  # wholly outside the secret (and the spaces around it)
            assert new == piece
        for k in range(len(SECRET) - 7):
            assert SECRET[k : k + 8] not in new


@settings(max_examples=200, deadline=None)
@given(case=text_with_secret(within_one_token=False))
def test_a_secret_over_several_tokens_is_masked_in_the_text_and_every_piece(case: Any) -> None:
    """Property: a secret spanning tokens is masked in the text and in every token it touches."""
    check_masked(*case)


@settings(max_examples=100, deadline=None)
@given(case=text_with_secret(within_one_token=True))
def test_a_secret_inside_one_token_is_masked_there(case: Any) -> None:
    """Property: a secret inside a single token is masked in that token and in the text."""
    check_masked(*case)


@settings(max_examples=100, deadline=None)
@given(case=vocab_and_ids(), repeat=st.integers(min_value=1, max_value=40))
def test_long_sequences_decode_as_the_joined_bytes(case: tuple[list[bytes], list[int]], repeat: int) -> None:
    """Property: a sequence long enough for the numpy gather decodes to its joined bytes, as short ones do."""
    vocab, ids = case
    long_ids = (ids or [0]) * (NUMPY_DECODE_IDS // len(ids or [0]) + repeat)
    assert len(long_ids) >= NUMPY_DECODE_IDS
    table = table_of(vocab)
    assert table.decode(long_ids) == b"".join(vocab[i] for i in long_ids).decode("utf-8", "replace")


@settings(max_examples=100, deadline=None)
@given(case=vocab_and_ids(), cuts=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=5))
def test_offsets_of_a_batch_of_long_sequences_match_their_pieces(
    case: tuple[list[bytes], list[int]], cuts: list[int]
) -> None:
    """Property: decoding a batch of long sequences, then asking each one's offsets (in any order, the same
    table across batches) gives the offsets its pieces spell, as a fresh table does."""
    vocab, ids = case
    base = (ids or [0]) * (NUMPY_DECODE_IDS // len(ids or [0]) + 1)
    table = table_of(vocab)
    for _ in range(2):  # two batches on one table
        batch = [base[c:] for c in cuts]
        texts = [table.decode(s) for s in batch]
        for s, text in reversed(list(zip(batch, texts))):
            ends = table.ends(s, None, text)
            pieces = table_of(vocab).pieces(s, None)
            assert ends is not None and split_text(text, ends.tolist()) == pieces
