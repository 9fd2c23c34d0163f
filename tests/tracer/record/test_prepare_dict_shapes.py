"""The writer writes a dict's plain values in line exactly as it writes them one by one (issue 13).

``Encoder._prepare_dict`` takes finite floats, ints within 64 bits, bools,
None and nested dicts without a call to ``prepare`` each (and
``prepare_captured`` goes straight to it for a dict). The property below
holds that shortcut to the per-value walk: for any dict of scalars and
nested values (huge ints, NaN and infinities, int, float and str
subclasses, enums, numpy scalars, secret keys, token fields), the same
JSON, the same token counts and the same strings for the secret scan.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tracer.record.capture import capture
from tracer.record.encode import Encoder, to_json
from tracer.record.redact import REDACTED, is_secret_key


class Level(enum.IntEnum):
    HIGH = 7


class Ratio(float):
    """A float subclass: not a plain float, so it takes the general walk."""


class Count(int):
    """An int subclass: likewise."""


scalars = st.one_of(
    st.integers(),
    st.integers(-(2**63) - 2, -(2**63) + 2),
    st.integers(2**63 - 2, 2**63 + 2),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.just(Level.HIGH),
    st.floats(allow_nan=True).map(Ratio),
    st.integers(-5, 5).map(Count),
    st.integers(0, 9).map(np.int64),
    st.floats(-1, 1).map(np.float32),
)
keys = st.sampled_from(["temperature", "n", "prompt_ids", "response_ids", "api_key", "stop", "x"]) | st.text(max_size=3)
values = st.recursive(
    scalars | st.lists(st.integers(0, 1000), max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=10,
)


def _encoder() -> Encoder:
    enc = Encoder((), token2text=False, max_tokens=8, store_full_token=True)
    enc.begin_record()
    return enc


def _one_by_one(enc: Encoder, value: dict[Any, Any], meta: dict[str, Any], path: str = "", depth: int = 0) -> Any:
    """What the dict walk wrote before its shortcuts: every non-token value through ``prepare``."""
    out: dict[str, Any] = {}
    for k, v in value.items():
        key = k if isinstance(k, str) else str(k)
        if key in enc.token_fields or type(v) is str:
            # token fields and strings take the same code on both sides (not what this test is about)
            out.update(enc._prepare_dict({key: v}, None, meta, path, depth))
            continue
        enc._cur.append(key)
        if is_secret_key(key):
            out[key] = REDACTED
        elif type(v) is dict:
            out[key] = _one_by_one(enc, v, meta, f"{path}{key}.", depth + 1)
        else:
            out[key] = enc.prepare(v, None, meta, f"{path}{key}.", depth + 1)
    return out


@given(st.dictionaries(keys, values, max_size=6))
def test_dict_shortcuts_write_what_the_walk_writes(value: dict[str, Any]) -> None:
    captured = capture(value)
    fast, slow = _encoder(), _encoder()
    fast_meta: dict[str, Any] = {}
    slow_meta: dict[str, Any] = {}
    got = fast.prepare_captured(captured, None, fast_meta)
    slow._captured = True
    want = _one_by_one(slow, captured, slow_meta)
    assert to_json(got) == to_json(want)
    assert fast_meta == slow_meta
    assert fast.strings == slow.strings


def test_plain_values_keep_their_json() -> None:
    enc = _encoder()
    value = {"t": 0.5, "n": 2**63 - 1, "big": 2**63, "neg": -(2**63) - 1, "nan": float("nan"), "b": True, "z": None}
    assert to_json(enc.prepare_captured(capture(value), None, {})) == (
        '{"t":0.5,"n":9223372036854775807,"big":"9223372036854775808",'
        '"neg":"-9223372036854775809","nan":"<nan>","b":true,"z":null}'
    )
