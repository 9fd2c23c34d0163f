"""The one guard on user objects: a stalled or raising method of the user's costs a placeholder, never a span.

Hostile objects block on :data:`RELEASE` (set when each test ends, so their
threads end too), raise, or answer slowly; they misbehave only while
:data:`ARMED` is set, so that building them (a dict hashing its keys) works.
Every call runs on a helper thread joined with :data:`CALLER_BOUND_S`: a call
the tracer held up fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from tracer.record import capture

#: The longest a traced call may take here (a call the tracer does not hold up takes microseconds).
CALLER_BOUND_S = 5.0
#: The guard's bound on a user's method in these tests.
USER_CALL_S = 0.2
RELEASE = threading.Event()
ARMED = threading.Event()


@pytest.fixture(autouse=True)
def _short_bound(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(capture, "USER_CALL_TIMEOUT_S", USER_CALL_S, raising=False)
    RELEASE.clear()
    ARMED.clear()
    yield
    ARMED.clear()
    RELEASE.set()  # the abandoned calls return, their threads end


def misbehave(how: str) -> Any:
    if not ARMED.is_set():
        return None
    if how == "block":
        RELEASE.wait()
    elif how == "slow":
        time.sleep(USER_CALL_S * 3)
    else:
        raise RuntimeError("hostile")
    return None


METHODS = ("__repr__", "__str__", "__iter__", "__len__", "__getattr__", "__eq__", "__hash__", "__bool__", "__float__")
BASES: tuple[type, ...] = (object, list, dict, str, int, tuple)


def hostile_class(base: type, method: str, how: str) -> type:
    """A subclass of ``base`` whose ``method`` blocks, sleeps past the bound or raises."""

    def behave(self: Any, *args: Any) -> Any:
        misbehave(how)
        default = getattr(base, method, None)
        if method == "__getattr__":
            raise AttributeError(args[0])
        return default(self, *args) if default is not None else 0

    return type(f"Hostile{base.__name__.title()}{method.strip('_').title()}", (base,), {method: behave})


def hostile_instance(base: type, method: str, how: str) -> Any:
    cls = hostile_class(base, method, how)
    return cls([1, 2]) if base in (list, tuple) else cls({"k": 1}) if base is dict else cls(7) if base is int else cls()


hostiles = st.builds(
    hostile_instance, st.sampled_from(BASES), st.sampled_from(METHODS), st.sampled_from(("block", "slow", "raise"))
)


def nest(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=3), children, max_size=3),
        st.lists(children, min_size=1, max_size=2).map(lambda xs: {x: 1 for x in xs if _hashable(x)}),
        children.map(lambda x: ValueError(x)),
        children.map(lambda x: KeyError("key", x)),
    )


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


values = st.recursive(st.one_of(hostiles, st.integers(), st.text(max_size=5)), nest, max_leaves=6)


def call_bounded(fn: Callable[[], Any]) -> None:
    """Run ``fn`` on a helper thread; fail when it is not back within :data:`CALLER_BOUND_S`."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(CALLER_BOUND_S)
    assert not thread.is_alive(), "a traced call was held up by the tracer"


def traced_calls(value: Any) -> list[Callable[[], Any]]:
    """Three calls meeting ``value``: as an argument, as the return value, inside a raised exception."""

    @tracer.rollout_trace_op(kind="tool")
    def takes(x: Any) -> int:
        return 1

    @tracer.rollout_trace_op(kind="tool")
    def returns() -> Any:
        return value

    @tracer.rollout_trace_op(kind="tool")
    def raises() -> None:
        raise ValueError(value)

    def raising() -> None:
        with pytest.raises(ValueError):
            raises()

    return [lambda: takes(value), returns, raising]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=values)
def test_any_hostile_object_costs_a_placeholder_never_a_span_nor_the_caller(value: Any) -> None:
    """Property: hostile objects of every kind, nested anywhere: calls return in bound, every span reaches disk."""
    out = tempfile.mkdtemp(prefix="guard-")
    tracer.init(output_dir=out, flush_interval_s=0.05)
    calls = traced_calls(value)
    ARMED.set()
    try:
        for call in calls:
            call_bounded(call)
        result = tracer.flush(timeout=30)
    finally:
        ARMED.clear()
        RELEASE.set()  # the calls abandoned in this example return: the next one meets a fresh guard
        for stuck in list(getattr(capture, "_GUARD", None).stuck if hasattr(capture, "_GUARD") else ()):
            stuck.join(CALLER_BOUND_S)
        RELEASE.clear()
    assert result.ok, result.message
    assert result.spans_written == len(calls)
    assert tracer.read_spans(out).num_rows == len(calls)
    tracer.shutdown()


class BlockingRepr:
    def __repr__(self) -> str:
        RELEASE.wait()
        return "late"


def test_an_exception_whose_message_blocks_stalls_neither_the_writer_nor_a_span(trace_dir: str) -> None:
    """A tool raising ValueError(obj) where obj's repr blocks: flush is ok and all 201 spans are on disk."""
    tracer.init(output_dir=trace_dir)

    @tracer.rollout_trace_op(kind="tool")
    def tool(i: int) -> None:
        if i % 2 == 0:
            raise ValueError(BlockingRepr())

    for i in range(201):
        try:
            tool(i)
        except ValueError:
            pass
    result = tracer.flush(timeout=20)
    assert result.ok and result.spans_written == 201, result.message
    rows = tracer.read_spans(trace_dir).to_pylist()
    errors = [json.loads(r["error"]) for r in rows if r["status"] == "error"]
    assert len(rows) == 201 and len(errors) == 101
    assert {e["type"] for e in errors} == {"ValueError"}
    assert "not recorded" in errors[0]["message"] and "user object not formatted" in result.message


class BlockingIterList(list):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[Any]:
        RELEASE.wait()
        return super().__iter__()


class SlowProxy:
    """An RPC proxy: every attribute it does not hold is a round trip that hangs."""

    def __getattr__(self, name: str) -> Any:
        RELEASE.wait()
        raise AttributeError(name)


@pytest.mark.parametrize("value", [BlockingIterList([1, 2, 3]), SlowProxy()], ids=["blocking __iter__", "slow proxy"])
def test_capturing_an_argument_never_runs_the_users_code_on_the_caller(trace_dir: str, value: Any) -> None:
    """A list subclass whose __iter__ blocks, a proxy whose attribute lookup hangs: the call returns at once."""
    tracer.init(output_dir=trace_dir)

    @tracer.rollout_trace_op(kind="tool")
    def tool(x: Any) -> Any:
        return x

    for _ in range(3):
        call_bounded(lambda: tool(value))
    assert tracer.flush(timeout=20).spans_written == 3
    rows = tracer.read_spans(trace_dir).to_pylist()
    assert len(rows) == 3 and all(r["inputs"] for r in rows)


def test_a_snapshot_keeps_the_shape_of_builtin_subclasses_and_plain_objects() -> None:
    """Subclasses are read through the builtin's own methods; plain objects' attributes are copied at call time."""
    import dataclasses

    @dataclasses.dataclass(slots=True)
    class Turn:
        role: str
        ids: list[int]

    class Named(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise RuntimeError("never called")

    turn = Turn("user", [1, 2])
    snap = capture.capture([turn, Named(a=1), BlockingIterList([4])])
    turn.ids.append(3)
    assert isinstance(snap[0], capture.ObjectSnapshot) and snap[0].attrs == {"role": "user", "ids": (1, 2)}
    assert snap[1] == {"a": 1} and snap[2] == [4]


def test_an_instance_attribute_is_read_without_the_users_code() -> None:
    """The writer's attribute lookup reads the instance's own attributes; properties and __getattr__ never run."""

    class Engine:
        def __init__(self) -> None:
            self.tokenizer = "tok"

    class Proxy(SlowProxy):
        @property
        def tokenizer(self) -> str:
            raise AssertionError("never called")

    class Loop:  # verl's agent loops keep their tokenizer on the class
        tokenizer = "class tok"

    assert capture.instance_attribute(Engine(), "tokenizer") == "tok"
    assert capture.instance_attribute(Loop(), "tokenizer") == "class tok"
    assert capture.instance_attribute(Proxy(), "tokenizer") is None
    assert capture.instance_attribute(BlockingIterList(), "tokenizer") is None
