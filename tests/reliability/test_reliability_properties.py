"""Property tests: whatever a traced function receives or returns, the user gets it back unchanged and the record is faithful.

Plain JSON values are recorded exactly (read back with :func:`tracer.read_spans`
and ``json.loads``). Anything else is recorded in a documented form (bytes as
text or base64, big ints and non-finite floats as text, arrays and tensors as
lists, other objects as their ``repr``) or replaced by a placeholder string
that starts with ``"<"``. Figures: inputs tried per property.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reliability_fixtures import FIGURES

import tracer

pytestmark = pytest.mark.usefixtures("figures_report")

#: function_scoped_fixture: the autouse fixtures (tracing off, allowed dirs) need no reset between
#: examples, each of which starts its own run; too_slow: every example records and reads a file.
PROPERTY_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

_steps = itertools.count(1)
TRIED: dict[str, int] = {}


@pytest.fixture(scope="module", autouse=True)
def _report_inputs_tried() -> Any:
    """After the module's properties ran, put how many inputs they tried into the reliability figures."""
    yield
    FIGURES["hypothesis"] = {f"inputs_tried_{k.replace(' ', '_')}": v for k, v in TRIED.items()}


@tracer.rollout_trace_op(kind="tool")
def echo(value: Any) -> Any:
    return value


@tracer.rollout_trace_op(kind="tool")
def raise_it(exc: BaseException) -> None:
    raise exc


def _record(value: Any, out: str, **config: Any) -> tuple[Any, dict[str, Any]]:
    """Call echo(value) in a trajectory of its own run; return what echo returned and its recorded row.

    A run (experiment) per example keeps each read small.
    """
    step = next(_steps)
    cfg = tracer.init(output_dir=out, experiment_name=f"e{step}", flush_interval_s=60.0, **config)
    with tracer.rollout_trace_attr(sample_index="0", step=step):
        returned = echo(value)
    result = tracer.flush()
    assert result.ok, result
    rows = tracer.read_spans(cfg.run_dir, columns=["name", "inputs", "outputs"]).to_pylist()
    (row,) = [r for r in rows if r["name"].endswith("echo")]
    return returned, row


# -- strategies -----------------------------------------------------------------------


def _texts(alphabet: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Texts up to 16 characters drawn whole, and up to 200 as a short draw repeated.

    Drawing 200 characters in each of a recursive value's 40-60 leaves overran hypothesis's
    data budget (data_too_large); repeating a short draw reaches the same lengths for a few bytes.
    """
    piece = st.text(alphabet=alphabet, min_size=1, max_size=8)
    return st.text(alphabet=alphabet, max_size=16) | st.tuples(piece, st.integers(2, 25)).map(lambda p: p[0] * p[1])


#: Any unicode, lone surrogates included.
any_text = _texts(st.characters(exclude_categories=()))
plain_floats = st.floats(allow_nan=False, allow_infinity=False)
plain_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | plain_floats | _texts(st.characters(codec="utf-8")),
    lambda children: st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=20), children, max_size=8),
    max_leaves=60,
)


class ReprRaises:
    """An object whose repr (and str) raise."""

    def __repr__(self) -> str:
        raise RuntimeError("repr is broken")

    __str__ = __repr__


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _numpy_values() -> st.SearchStrategy[Any]:
    import numpy as np
    from hypothesis.extra import numpy as hnp

    dtypes = hnp.integer_dtypes() | hnp.floating_dtypes() | hnp.boolean_dtypes()
    arrays = hnp.arrays(dtypes, hnp.array_shapes(min_dims=0, max_dims=3, max_side=5))
    objects = st.lists(st.integers() | st.text(max_size=5) | st.none(), max_size=5).map(
        lambda xs: np.array(xs + [None], dtype=object)
    )
    return arrays | objects | st.integers(-(2**31), 2**31).map(np.int64) | st.floats(width=32).map(np.float32)


def _torch_values() -> st.SearchStrategy[Any]:
    import torch

    return st.lists(st.floats(width=32), max_size=20).map(lambda xs: torch.tensor(xs)) | st.integers(-1000, 1000).map(
        torch.tensor
    )


hostile_leaves = (
    any_text
    | st.integers()  # beyond 64 bits too
    | st.floats()  # NaN, inf
    | st.binary(max_size=64)
    | st.binary(max_size=64).map(bytearray)
    | st.builds(ReprRaises)
    | st.builds(object)
    | st.sampled_from([Ellipsis, NotImplemented, print, int, 1 + 2j, range(3)])
)


def hostile_values() -> st.SearchStrategy[Any]:
    # numpy and torch values when installed (torch comes with the hf extra, not the test extra).
    leaves = hostile_leaves
    if _installed("numpy"):
        leaves = leaves | _numpy_values()
    if _installed("torch"):
        leaves = leaves | _torch_values()
    return st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=6)
            | st.tuples(children, children)
            | st.dictionaries(any_text | st.integers(), children, max_size=6)
            | st.frozensets(st.integers(), max_size=5)
        ),
        max_leaves=40,
    )


# -- the checker -------------------------------------------------------------------------


def _is_placeholder(recorded: Any) -> bool:
    return isinstance(recorded, str) and recorded.startswith("<")


def faithful(recorded: Any, original: Any, depth: int = 0) -> bool:
    """Is ``recorded`` (decoded JSON) a faithful record of ``original``, or a marked placeholder?"""
    if _is_placeholder(recorded) and not (isinstance(original, str) and recorded == original):
        return True
    cls = type(original)
    module = cls.__module__
    if original is None or cls is bool:
        return recorded is original
    if cls is int:
        # Beyond 64 bits: exact JSON number (inside a flat int list) or its decimal text.
        return recorded == original or (not -(2**63) <= original < 2**63 and recorded == str(original))
    if cls is float:
        return recorded == original if math.isfinite(original) else recorded == repr(original)
    if cls is str:
        return recorded == original
    if isinstance(original, (bytes, bytearray)):
        try:
            return recorded == bytes(original).decode("utf-8")
        except UnicodeDecodeError:
            return recorded == {"__bytes_b64__": base64.b64encode(bytes(original)).decode("ascii")}
    if module == "numpy" or module.startswith("numpy.") or (module == "torch" and cls.__name__ == "Tensor"):
        return faithful(recorded, original.tolist(), depth + 1)
    if isinstance(original, (list, tuple)):
        return (
            isinstance(recorded, list)
            and len(recorded) == len(original)
            and all(faithful(r, o, depth + 1) for r, o in zip(recorded, original))
        )
    if isinstance(original, (set, frozenset)):
        return isinstance(recorded, list) and sorted(recorded) == sorted(original)
    if isinstance(original, dict):
        if not isinstance(recorded, dict):
            return False
        keys = {k if isinstance(k, str) else str(k): v for k, v in original.items()}
        return recorded.keys() == keys.keys() and all(faithful(recorded[k], v, depth + 1) for k, v in keys.items())
    return isinstance(recorded, str)  # other objects: their repr


# -- properties ----------------------------------------------------------------------------


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(value=plain_json)
def test_plain_json_round_trips_exactly(value: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Any plain JSON value: echo returns the very object, and inputs/outputs read back equal to it."""
    returned, row = _record(value, os.fspath(tmp_path_factory.getbasetemp() / "json"), redact=False)
    TRIED["plain JSON"] = TRIED.get("plain JSON", 0) + 1
    assert returned is value
    assert json.loads(row["inputs"]) == {"value": value}
    assert json.loads(row["outputs"]) == value


def _pinned_examples() -> list[Any]:
    """Cases every run tries, whatever hypothesis draws."""
    cases: list[Any] = [
        "lone \ud800 surrogate",
        b"\xff\xfe invalid utf-8",
        2**70,
        -(2**64),
        [1, 2**64, 3],
        float("nan"),
        [float("inf"), float("-inf")],
        {"k": object(), 3: [b"\x00"], None: (1, 2)},
    ]
    if _installed("numpy"):
        import numpy as np

        cases += [np.array(5), np.array([1, None, "x"], dtype=object), np.zeros((2, 3), dtype=np.float16)]
    if _installed("torch"):
        import torch

        cases.append(torch.tensor([[1.5, float("nan")]]))
    return cases


def _with_pinned_examples(fn: Any) -> Any:
    for value in _pinned_examples():
        fn = example(value=value)(fn)
    return fn


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(value=hostile_values())
@_with_pinned_examples
def test_hostile_values_pass_through_and_are_recorded_faithfully(
    value: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Surrogates, big ints, NaN, bytes, arrays, tensors, broken repr: echo returns the very object; the record is faithful or a '<' placeholder."""
    returned, row = _record(value, os.fspath(tmp_path_factory.getbasetemp() / "hostile"))
    TRIED["hostile"] = TRIED.get("hostile", 0) + 1
    assert returned is value
    recorded_in = json.loads(row["inputs"])
    assert faithful(recorded_in["value"], value), (recorded_in, value)
    assert faithful(json.loads(row["outputs"]), value)


@settings(PROPERTY_SETTINGS, max_examples=100)
@given(
    exc=st.sampled_from([ValueError, KeyError, RuntimeError, UnicodeError]).flatmap(lambda cls: any_text.map(cls))
    | st.just(KeyboardInterrupt("stop"))
)
def test_exceptions_pass_through_unchanged(exc: BaseException, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A traced function's exception reaches the caller as the very same object; the span is status 'error' with its type."""
    step = next(_steps)
    cfg = tracer.init(output_dir=os.fspath(tmp_path_factory.getbasetemp() / "exc"), experiment_name=f"e{step}")
    with pytest.raises(BaseException) as info, tracer.rollout_trace_attr(sample_index="0", step=step):
        raise_it(exc)
    TRIED["exceptions"] = TRIED.get("exceptions", 0) + 1
    assert info.value is exc
    assert tracer.flush().ok
    rows = tracer.read_spans(cfg.run_dir, columns=["name", "status", "error"]).to_pylist()
    (row,) = [r for r in rows if r["name"].endswith("raise_it")]
    assert row["status"] == "error" and type(exc).__name__ in json.loads(row["error"])["type"]


def test_objects_whose_repr_raises_are_recorded_as_placeholders(trace_dir: str) -> None:
    """An object whose repr raises, alone or nested: echo returns it; the record holds a '<' placeholder naming its type."""
    broken = ReprRaises()
    for value in (broken, {"k": broken, 3: [b"\x00"], None: (1, 2)}, [broken, [broken]]):
        returned, row = _record(value, trace_dir)
        assert returned is value
        assert faithful(json.loads(row["outputs"]), value)
        assert "<ReprRaises: repr failed" in row["outputs"]


def test_a_list_containing_itself_is_cut_with_a_placeholder(trace_dir: str) -> None:
    """A cyclic list: echo returns it; the record is the list unrolled to a bounded depth, ending in a '<' placeholder."""
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    cyclic_dict: dict[str, Any] = {"a": 1}
    cyclic_dict["self"] = cyclic_dict
    for value in (cyclic, cyclic_dict):
        returned, row = _record(value, trace_dir)
        assert returned is value
        recorded = json.loads(row["outputs"])
        assert faithful(recorded, value)
        assert "<" in row["outputs"]


def test_deep_nesting_is_cut_with_a_placeholder(trace_dir: str) -> None:
    """10,000 levels of nested lists: no RecursionError anywhere; the record ends in a '<' placeholder."""
    deep: Any = "leaf"
    for _ in range(10_000):
        deep = [deep]
    returned, row = _record(deep, trace_dir)
    assert returned is deep
    assert faithful(json.loads(row["outputs"]), deep)


@pytest.mark.slow
def test_huge_strings_and_lists_round_trip(trace_dir: str) -> None:
    """A 20 MB string and a 2-million-element list are recorded whole and read back equal."""
    big_text = "ä" * 10_000_000
    big_list = list(range(2_000_000))
    for value in (big_text, big_list, {"text": big_text[:1000], "ids": big_list[:1000]}):
        returned, row = _record(value, trace_dir)
        assert returned is value
        assert json.loads(row["outputs"]) == value
