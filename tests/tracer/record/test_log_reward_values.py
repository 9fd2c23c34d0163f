"""log_reward keeps every real number it is given: exactly, or clamped and marked, never lost."""

from __future__ import annotations

import decimal
import fractions
import json
import math
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from tracer import schema as S
from tracer.record.accounting import ATTR_REPLACED

FLOAT_MAX = sys.float_info.max


def reward_rows(path: str) -> list[dict[str, Any]]:
    return [r for r in tracer.read_spans(path).to_pylist() if r["name"] == S.REWARD_SPAN_NAME]


def test_an_int_beyond_the_float_range_is_clamped_marked_and_reported(trace_dir: str) -> None:
    """log_reward(10**400): the row is written with the largest float, marked in the span, counted by flush."""
    tracer.init(output_dir=trace_dir)
    tracer.log_reward(10**400, step=1, sample_index="a")
    tracer.log_reward(-(10**400), step=1, sample_index="b")
    result = tracer.flush()
    rows = {r["sample_index"]: r for r in reward_rows(trace_dir)}
    assert rows["a"]["reward"] == FLOAT_MAX and rows["b"]["reward"] == -FLOAT_MAX
    assert "beyond the float range" in json.loads(rows["a"]["attributes"])[ATTR_REPLACED]["reward"]
    assert result.values_replaced == 2 and "reward" in result.message


def expected(value: Any) -> tuple[float, bool]:
    """The float a reward is written as, and whether it is marked as not its exact value."""
    try:
        f = float(value)
    except OverflowError:
        return (FLOAT_MAX if value > 0 else -FLOAT_MAX), True
    except ValueError:  # a signalling NaN
        return math.nan, True
    if math.isinf(f) and value * 2 != value:
        return math.copysign(FLOAT_MAX, f), True
    return f, False


decimals = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True),
    st.integers(-(10**500), 10**500).map(lambda i: decimal.Decimal(i).scaleb(st_exp(i))),
    st.sampled_from([decimal.Decimal("sNaN"), decimal.Decimal("1e400"), decimal.Decimal("-1e-400")]),
)


def st_exp(i: int) -> int:
    return (abs(i) % 7) * 100


numpy_scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(0, 2**64 - 1).map(np.uint64),
    st.floats(width=32).map(np.float32),
    st.floats(width=16).map(np.float16),
    st.floats().map(np.longdouble),
    st.just(np.longdouble(10) ** 400) if np.finfo(np.longdouble).max > 1e400 else st.nothing(),
)

rewards = st.one_of(
    st.integers(-(10**600), 10**600),
    st.floats(allow_nan=True, allow_infinity=True),
    decimals,
    numpy_scalars,
    st.fractions(max_denominator=10**6),
    st.integers(-(10**400), 10**400).map(lambda i: fractions.Fraction(i * 10**320, 3)),
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(values=st.lists(rewards, min_size=1, max_size=8))
def test_any_real_reward_is_written_exactly_or_clamped_and_marked(trace_dir: str, values: list[Any]) -> None:
    """Property: any int, float, Decimal, Fraction or numpy scalar reward is written: its float, or marked."""
    tracer.shutdown()
    import shutil

    shutil.rmtree(trace_dir, ignore_errors=True)
    tracer.init(output_dir=trace_dir)
    for i, value in enumerate(values):
        tracer.log_reward(value, step=0, sample_index=str(i))
    result = tracer.flush()
    assert result.ok, result.message
    rows = {r["sample_index"]: r for r in reward_rows(trace_dir)}
    assert len(rows) == len(values)
    marked = 0
    for i, value in enumerate(values):
        row = rows[str(i)]
        want, mark = expected(value)
        got = row["reward"]
        assert (math.isnan(got) and math.isnan(want)) or got == want, (value, got, want)
        note = json.loads(row["attributes"] or "{}").get(ATTR_REPLACED, {})
        assert ("reward" in note) == mark, (value, note)
        marked += mark
    assert result.values_replaced == marked


@pytest.mark.parametrize("value", [True, np.bool_(True), 1j, "1.0", None, [1.0]])
def test_a_value_that_is_no_real_number_is_refused_by_name(value: Any) -> None:
    """Bools, complex numbers, strings, None and lists raise TypeError naming what was given."""
    with pytest.raises(TypeError, match="real number"):
        tracer.log_reward(value, step=0, sample_index="x")
