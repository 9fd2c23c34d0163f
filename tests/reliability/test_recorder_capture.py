"""Inputs as they were at call time; generators, classmethods and hostile extras (issue 12, items 4-5).

Whatever container or object a traced call receives, mutating it after the
call changes nothing recorded: the record equals that of an untouched deep
copy passed at the same time. Generators and async generators get a span
that covers their iteration and its errors. Figures: inputs tried.
"""

from __future__ import annotations

import array
import asyncio
import collections
import copy
import json
import types
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_fixtures import FIGURES

import tracer

pytestmark = pytest.mark.usefixtures("figures_report")

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TRIED = {"mutable inputs": 0, "generator shapes": 0}


class Plain:
    """A user object with attributes and the default repr."""

    def __init__(self, value: Any) -> None:
        self.value = value


class Shown:
    """A user object whose repr shows its state."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Shown({self.value!r})"


leaves = st.integers(-1000, 1000) | st.text(max_size=10) | st.none()
mutables = st.recursive(
    leaves,
    lambda c: (
        st.lists(c, max_size=4)
        | st.dictionaries(st.text(max_size=5), c, max_size=4)
        | st.lists(c, max_size=4).map(collections.deque)
        | st.binary(max_size=8).map(bytearray)
        | st.lists(st.integers(-100, 100), max_size=6).map(lambda xs: array.array("i", xs))
        | c.map(Plain)
        | c.map(Shown)
        | c.map(lambda v: types.SimpleNamespace(v=v))
    ),
    max_leaves=12,
)


def _mutate(value: Any, depth: int = 0) -> None:
    """Change every mutable part of ``value`` in place."""
    if depth > 40:
        return
    if isinstance(value, (list, collections.deque)):
        for v in list(value):
            _mutate(v, depth + 1)
        value.append("MUTATED")
    elif isinstance(value, dict):
        for v in list(value.values()):
            _mutate(v, depth + 1)
        value["MUTATED"] = 1
    elif isinstance(value, bytearray):
        value.extend(b"MUTATED")
    elif isinstance(value, array.array):
        value.append(99999)
    elif isinstance(value, (Plain, Shown, types.SimpleNamespace)):
        _mutate(value.__dict__, depth + 1)
        value.extra = "MUTATED"


@tracer.rollout_trace_op(kind="tool")
def take(value: Any) -> None:
    return None


@SETTINGS
@given(value=mutables)
def test_inputs_are_recorded_as_they_were_at_call_time(tmp_path_factory: pytest.TempPathFactory, value: Any) -> None:
    """Mutating an argument after the call: its record equals the record of an untouched copy."""
    cfg = tracer.init(output_dir=str(tmp_path_factory.mktemp("m")), flush_interval_s=60.0)
    pristine = copy.deepcopy(value)
    take(value)
    take(pristine)
    _mutate(value)
    assert tracer.flush().ok
    a, b = (r["inputs"] for r in tracer.read_spans(cfg.run_dir).to_pylist())
    assert a == b
    assert "MUTATED" not in a and "99999" not in a
    tracer.shutdown()
    TRIED["mutable inputs"] += 1
    FIGURES["inputs at call time"] = {"inputs tried": TRIED["mutable inputs"]}


@tracer.rollout_trace_op(kind="llm")
def stream(n: int, fail_at: int | None) -> Any:
    for i in range(n):
        if i == fail_at:
            raise ValueError(f"failed at {i}")
        yield i


@tracer.rollout_trace_op(kind="llm")
async def astream(n: int, fail_at: int | None) -> Any:
    for i in range(n):
        await asyncio.sleep(0)
        if i == fail_at:
            raise ValueError(f"failed at {i}")
        yield i


@SETTINGS
@given(
    n=st.integers(0, 20),
    fail=st.none() | st.integers(0, 20),
    stop=st.none() | st.integers(0, 20),
    use_async=st.booleans(),
)
def test_generator_spans_cover_the_iteration_and_its_errors(
    tmp_path_factory: pytest.TempPathFactory, n: int, fail: int | None, stop: int | None, use_async: bool
) -> None:
    """A traced (async) generator: one span from first item to exhaustion, error or early close, with what it yielded."""
    cfg = tracer.init(output_dir=str(tmp_path_factory.mktemp("g")), flush_interval_s=60.0)
    got: list[int] = []
    raised = False

    async def consume_async() -> None:
        gen = astream(n, fail)
        try:
            async for item in gen:
                got.append(item)
                if stop is not None and len(got) > stop:
                    break
        finally:
            await gen.aclose()

    try:
        if use_async:
            asyncio.run(consume_async())
        else:
            gen = stream(n, fail)
            for item in gen:
                got.append(item)
                if stop is not None and len(got) > stop:
                    gen.close()
                    break
    except ValueError:
        raised = True
    assert tracer.flush().ok
    (row,) = tracer.read_spans(cfg.run_dir).to_pylist()
    if raised:
        assert row["status"] == "error" and "failed at" in row["error"]
    else:
        assert row["status"] == "ok"
        assert json.loads(row["outputs"])["yielded"] == got
    tracer.shutdown()
    TRIED["generator shapes"] += 1
    FIGURES["generators"] = {"shapes tried": TRIED["generator shapes"]}


def test_a_generator_span_lasts_as_long_as_its_iteration(trace_dir: str) -> None:
    """Work done between items falls inside the span (start before the first item, end after the last)."""
    import time

    marks: list[int] = []

    @tracer.rollout_trace_op
    def gen() -> Any:
        for i in range(3):
            marks.append(time.time_ns())
            yield i

    cfg = tracer.init(output_dir=trace_dir, flush_interval_s=60.0)
    assert list(gen()) == [0, 1, 2]
    assert tracer.flush().ok
    (row,) = tracer.read_spans(cfg.run_dir).to_pylist()
    assert row["start_ns"] <= marks[0] and marks[-1] <= row["end_ns"]


def test_classmethods_and_staticmethods_can_be_traced(trace_dir: str) -> None:
    """@rollout_trace_op above @classmethod / @staticmethod: the call works and is recorded without cls."""

    class Tool:
        @tracer.rollout_trace_op
        @classmethod
        def make(cls, x: int) -> int:
            return x + 1

        @tracer.rollout_trace_op(name="static")
        @staticmethod
        def helper(x: int) -> int:
            return x * 2

    cfg = tracer.init(output_dir=trace_dir, flush_interval_s=60.0)
    assert Tool.make(1) == 2 and Tool().make(2) == 3 and Tool.helper(3) == 6
    assert tracer.flush().ok
    rows = tracer.read_spans(cfg.run_dir).to_pylist()
    assert len(rows) == 3
    assert {json.dumps(json.loads(r["inputs"])) for r in rows} == {'{"x": 1}', '{"x": 2}', '{"x": 3}'}


class Hostile:
    """Every attribute access raises, and so do str and repr."""

    def __getattribute__(self, name: str) -> Any:
        raise RuntimeError(f"no {name}")


def test_hostile_extras_never_reach_the_user(trace_dir: str) -> None:
    """rollout_trace_attr(**extra) with an object whose attribute access raises: the block runs, the span is written."""
    cfg = tracer.init(output_dir=trace_dir, flush_interval_s=60.0)
    with tracer.rollout_trace_attr(sample_index=Hostile(), step=1, info=Hostile()):
        take(1)
    assert tracer.flush().ok
    assert len(tracer.read_spans(cfg.run_dir)) == 2
