"""The writer's fast path for captured values agrees with its general walk (issue 13).

``capture`` keeps a sequence as a tuple only when it is a checked id list
(plain non-negative ints within 64 bits); the writer
(``Encoder.prepare_captured``) then takes such tuples without reading their
items again, and writes the plain shapes of a dict's values without a call
each. The properties below pin that: for any captured value the fast path
writes the same JSON, counts the same tokens, and hands the secret scan the
same strings as the general walk; and what a call passes is recorded
redacted however it reaches the writer (defaults, ``*args``, tuples).
"""

from __future__ import annotations

import enum
import json
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from tracer import schema as S
from tracer.record import spec as R
from tracer.record.capture import NON_NEGATIVE_INTS, capture, int_kind
from tracer.record.encode import Encoder, to_json
from tracer.record.redact import Redactor

SECRET = "sk-" + "a1B2c3D4e5F6g7H8i9J0"


class Shade(enum.IntEnum):
    DARK = 3


class Tag(str):
    """A str subclass: written through its repr, like any unknown object."""


scalars = st.one_of(
    st.integers(),  # huge ones too
    st.integers(0, 200_000),
    st.integers(-5, -1),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.text(max_size=4),
    st.just(SECRET),
    st.integers(0, 9).map(np.int64),
    st.just(Shade.DARK),
    st.text(max_size=3).map(Tag),
)


def _object_array(value: Any) -> Any:
    out = np.empty(1, dtype=object)  # tolist() hands the writer what capture never saw
    out[0] = value
    return out


id_lists = st.lists(st.integers(0, 200_000), max_size=20)
keys = st.sampled_from(["prompt_ids", "response_ids", "input_ids", "text", "api_key", "n", "x"]) | st.text(max_size=3)
values = st.recursive(
    scalars | id_lists | id_lists.map(tuple),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
        inner.map(_object_array),
    ),
    max_leaves=8,
)


def _walk(value: Any, fast: bool) -> tuple[str, dict[str, Any], list[str]]:
    enc = Encoder((), token2text=False, max_tokens=8, store_full_token=True)
    enc.begin_record()
    meta: dict[str, Any] = {}
    out = enc.prepare_captured(value, None, meta) if fast else enc.prepare(value, None, meta)
    return to_json(out), meta, sorted(enc.strings[0])


def _tuples(value: Any) -> list[tuple[Any, ...]]:
    if type(value) is tuple:
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tuples(v)]
    if isinstance(value, list):
        return [t for v in value for t in _tuples(v)]
    return []


@settings(max_examples=200, deadline=None)
@given(value=st.dictionaries(keys, values, max_size=5) | values)
def test_captured_tuples_are_checked_ids_and_the_fast_path_writes_what_the_general_walk_does(value: Any) -> None:
    """Property: any captured value: every tuple in it is ids; fast path == general walk (JSON, counts, strings)."""
    captured = capture(value)
    for t in _tuples(captured):
        assert int_kind(t) == NON_NEGATIVE_INTS, t
    assert _walk(captured, fast=True) == _walk(captured, fast=False)


REDACTOR = Redactor(environ={})


@settings(max_examples=150, deadline=None)
@given(value=values, key=keys)
def test_a_secret_anywhere_in_a_captured_value_is_redacted(value: Any, key: str) -> None:
    """Property: a secret string inside any captured value (in tuples too) never reaches the JSON."""
    captured = capture({key: [value, (SECRET,), {"deep": (1, SECRET)}]})
    enc = Encoder((), token2text=False, max_tokens=None, store_full_token=True)
    enc.begin_record()
    out = enc.prepare_captured(captured, None, {})
    flags = REDACTOR.records_to_scan(enc.strings, enc.opaque)
    if flags is not None and flags[0]:
        out = REDACTOR.value(out)
    assert SECRET not in to_json(out)


def _verl_generate(prompt_ids: Any, *extra: Any, stop: Any = (SECRET, 7), **kwargs: Any) -> dict[str, Any]:
    return {"response_ids": list(prompt_ids), "finish_reason": "stop"}


setattr(_verl_generate, R.LAYOUT_ATTR, R.LAYOUT_VERL)
verl_generate = tracer.rollout_trace_op(kind="llm")(_verl_generate)


def _rows(run_dir: str) -> list[dict[str, Any]]:
    rows = tracer.read_spans(run_dir).to_pylist()
    return [r for r in rows if r[S.KIND] == S.KIND_LLM]


def test_defaults_and_star_args_are_scanned_like_captured_values(trace_dir: str) -> None:
    """A default (never captured at call time) and ``*args`` holding tuples of strings are redacted, not taken as ids."""
    tracer.init(output_dir=trace_dir)
    with tracer.rollout_trace_attr(sample_index=0, step=0):
        verl_generate([1, 2, 3], ("x", SECRET), temperature=(SECRET,))
    assert tracer.flush().ok
    (row,) = _rows(tracer.get_config().run_dir)
    assert SECRET not in row[S.INPUTS]
    inputs = json.loads(row[S.INPUTS])
    assert inputs["stop"] == ["<redacted>", 7]
    assert inputs["extra"] == [["x", "<redacted>"]]
    assert inputs["prompt_ids"] == [1, 2, 3]
