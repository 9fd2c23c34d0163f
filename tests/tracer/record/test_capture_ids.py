"""Token id lists on the recording path: checked once in C, captured as tuples, written exactly (issue 13).

``int_kind`` decides what is a token id list; the properties below pin it
to its definition (plain ints within 64 bits) for any list, and check that
whatever a token field holds (ids, huge ints, bools, floats, nested lists,
numpy arrays, torch tensors) is recorded as it was at call time, with a
token count exactly when it is an id list.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracer_fixtures import hf_tokenizer

import tracer
from tracer.record.capture import INTS, NON_NEGATIVE_INTS, NOT_INTS, capture, int_kind
from tracer.record.encode import Encoder, to_json
from tracer.schema import ATTR_TOKENS

INT64 = (-(2**63), 2**63)


class Color(enum.IntEnum):
    RED = 1


def _is_int64(x: Any) -> bool:
    return type(x) is int and INT64[0] <= x < INT64[1]


def _id_item(x: Any) -> bool:
    """A plain int within 64 bits, or an enum member whose value is one (written as that value)."""
    return _is_int64(x) or (isinstance(x, enum.Enum) and _is_int64(x.value))


plain_elements = st.one_of(
    st.integers(),  # huge ones too
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 200_000),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(0, 9), max_size=3),
    st.integers(0, 9).map(np.int64),
)
elements = plain_elements | st.just(Color.RED)
id_lists = st.lists(st.integers(0, 200_000), max_size=40)
sequences = st.one_of(id_lists, st.lists(elements, max_size=12))


@settings(max_examples=300, deadline=None)
@given(value=sequences, as_tuple=st.booleans())
def test_int_kind_is_plain_ints_within_64_bits(value: list[Any], as_tuple: bool) -> None:
    """Property: int_kind says ints exactly when every item is a plain int of at most 64 bits, and their sign."""
    seq = tuple(value) if as_tuple else value
    if not all(_id_item(x) for x in value):
        assert int_kind(seq) == NOT_INTS
    elif all(x >= 0 for x in value):
        assert int_kind(seq) == NON_NEGATIVE_INTS
    else:
        assert int_kind(seq) == INTS


def _norm(value: Any) -> Any:
    """JSON-comparable form: ints beyond 64 bits as their digits (written either way), arrays as lists."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, np.integer):
        return int(value)
    if type(value) is int and not INT64[0] <= value < INT64[1]:
        return str(value)
    return value


arrays_and_nested = st.one_of(
    id_lists.map(lambda xs: np.array(xs, dtype=np.int64)),
    st.lists(st.lists(st.integers(0, 50), max_size=3), max_size=3),
)
token_values = sequences | arrays_and_nested
#: Without enum members: outside an id list they are written as objects (not this file's subject).
plain_token_values = id_lists | st.lists(plain_elements, max_size=12) | arrays_and_nested


def _is_id_list(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim == 1
    return all(_id_item(x) for x in value)


@settings(max_examples=300, deadline=None)
@given(value=token_values)
def test_a_token_field_is_written_as_given_and_counted_only_when_it_is_ids(value: Any) -> None:
    """Property: captured, then mutated, then encoded: the JSON holds the call-time value; a count only for ids."""
    if any(isinstance(x, np.integer) for x in value) or (
        any(isinstance(x, enum.Enum) for x in value) and not _is_id_list(value)
    ):
        return  # objects in a list that is not ids (numpy scalars, enums): their own paths, not this property
    is_ids = _is_id_list(value)
    before = json.dumps(_norm(value))
    captured = capture({"prompt_ids": value, "other": value})
    if isinstance(value, list):
        value.append(-7)  # the caller's list changes after the call
    elif isinstance(value, np.ndarray) and value.size:
        value[0] = -7
    enc = Encoder((), token2text=False, max_tokens=None, store_full_token=True)
    enc.begin_record()
    meta: dict[str, Any] = {}
    written = json.loads(to_json(enc.prepare(captured, None, meta)))
    assert json.dumps(_norm(written["prompt_ids"])) == before
    assert json.dumps(_norm(written["other"])) == before
    counted = meta.get(ATTR_TOKENS, {}).get("prompt_ids")
    assert counted == (len(json.loads(before)) if is_ids else None)


@tracer.rollout_trace_op(kind="llm")
def generate(prompt_ids: Any, response: Any) -> dict[str, Any]:
    return {"response_ids": response, "finish_reason": "stop"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.lists(
        st.tuples(plain_token_values, id_lists | st.lists(plain_elements, max_size=5)), min_size=1, max_size=6
    ),
    tensors=st.booleans(),
)
def test_recorded_ids_are_the_call_time_values_end_to_end(
    tmp_path_factory: Any, calls: list[tuple[Any, Any]], tensors: bool
) -> None:
    """Property: through the recorder and the files, prompt and response ids read back as passed, whatever they hold."""
    cfg = tracer.init(output_dir=str(tmp_path_factory.mktemp("ids")), flush_interval_s=60.0)
    expected = []
    for prompt, response in calls:
        if tensors and isinstance(prompt, list) and all(_is_int64(x) and x < 2**31 for x in prompt):
            prompt = torch.tensor(prompt, dtype=torch.int64)
        expected.append((json.dumps(_norm(prompt)), json.dumps(_norm(response))))
        generate(prompt, response)
        for v in (prompt, response):
            if isinstance(v, list):
                v.append("MUTATED")
            elif isinstance(v, torch.Tensor) and v.numel():
                v[0] = -7
    assert tracer.flush().ok
    rows = tracer.read_spans(cfg.run_dir).to_pylist()
    tracer.shutdown()
    assert len(rows) == len(calls)
    for row, (prompt, response) in zip(rows, expected):
        assert json.dumps(_norm(json.loads(row["inputs"])["prompt_ids"])) == prompt
        assert json.dumps(_norm(json.loads(row["outputs"])["response_ids"])) == response


class Plain(enum.Enum):
    A = 3


def test_enum_members_in_an_id_list_are_written_as_their_values_and_decoding_fails_soft(trace_dir: str) -> None:
    """An id list holding enum members (first or not) is written as their values; token2text never loses a span."""
    tok = hf_tokenizer()
    cfg = tracer.init(output_dir=trace_dir, token2text=True, tokenizer=tok)
    generate([1, 2, 3], [Color.RED, 2])
    generate([4, Plain.A], [2, Plain.A])
    generate([4, 5], [6])
    assert tracer.flush().ok
    rows = tracer.read_spans(cfg.run_dir).to_pylist()
    tracer.shutdown()
    assert [json.loads(r["inputs"])["prompt_ids"] for r in rows] == [[1, 2, 3], [4, 3], [4, 5]]
    assert [json.loads(r["outputs"])["response_ids"] for r in rows] == [[1, 2], [2, 3], [6]]
    assert json.loads(rows[2]["outputs"])["response_text"] == tok.decode([6])


@settings(max_examples=200, deadline=None)
@given(value=id_lists | st.lists(plain_elements, max_size=12), as_tuple=st.booleans())
def test_flat_captures_are_untracked_and_nested_ones_are_not(value: list[Any], as_tuple: bool) -> None:
    """Property: a sequence of scalars (checked ids as a tuple, anything else flat as a list) is captured as a copy
    the collector no longer tracks (it holds nothing that could hold it); one holding containers keeps its
    tracking; every value is captured equal, and stays so through a collection."""
    import gc

    from tracer.record.capture import GC_UNTRACK

    assert GC_UNTRACK is not None  # CPython here: the untracking is what is under test
    seq = tuple(value) if as_tuple else list(value)
    got = capture(seq)
    assert _norm(got) == _norm(value)
    flat = all(type(x) in (int, float, bool, str, type(None)) for x in value)
    if value and int_kind(seq) == NON_NEGATIVE_INTS:
        assert type(got) is tuple
    if flat:
        assert not gc.is_tracked(got)
    elif type(got) is list:
        assert gc.is_tracked(got)
    gc.collect(0)  # a collection of the young objects, where the copy was, finds nothing amiss
    assert _norm(got) == _norm(value)
