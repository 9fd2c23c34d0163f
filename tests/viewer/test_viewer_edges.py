"""Numbers and text at their edges (issue 28, class 6): URL parameters, huge latencies, text printed to a terminal."""

from __future__ import annotations

import math
import os
import re
import shlex
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from apptest_fixtures import new_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from viewer_fixtures import record_run

import tracer
from tracer import schema as S
from tracer.cli.tail import Tail, trajectory_line
from tracer.cli.terminal import terminal_text
from tracer.follow import RunFollower
from viewer import state
from viewer.data.runs import seconds_between

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
EDGE_TEXT = st.one_of(
    st.sampled_from(["1e309", "-1e309", "nan", "inf", "-inf", "1e-320", "9" * 400, "", " ", "0x10", "2**64"]),
    st.sampled_from([str(2**63), str(-(2**63) - 1), str(2**53 + 1)]),
    st.integers().map(str),
    st.floats().map(str),
    st.text(max_size=40),
    st.just("x" * (state.MAX_PARAM_CHARS + 1)),
)


@given(EDGE_TEXT, st.sampled_from([int, float, bool, str]))
def test_parse_param_never_raises_and_keeps_its_bounds(text: str, kind: type) -> None:
    """Any text gives None or a value of the kind: ints in int64 and the bounds, floats finite and bounded."""
    got = state.parse_param(text, kind, lo=-5 if kind in (int, float) else None, hi=5 if kind in (int, float) else None)
    assert got is None or isinstance(got, kind)
    if isinstance(got, (int, float)) and not isinstance(got, bool):
        assert math.isfinite(got) and -5 <= got <= 5
    assert state.parse_param("x" * (state.MAX_PARAM_CHARS + 1), str) is None
    assert state.parse_param(str(2**63), int) is None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([state.QP_INTERVAL, state.QP_STEP, state.QP_STEP_A, state.QP_VIEW, state.QP_FOLLOW]), EDGE_TEXT)
def test_any_url_parameter_draws_the_page(small_run: str, name: str, value: str) -> None:
    """A page opened with any value of a parameter draws without an exception or a broken view."""
    at = new_app(path=small_run, **{name: value})
    at.run()
    assert not at.exception, at.exception[0].message if at.exception else ""
    assert not [e for e in at.error if "Could not draw" in e.value]


@given(INT64, INT64)
def test_seconds_between_never_raises(start: int, end: int) -> None:
    """A latency from any two int64 times is a float close to (end - start) / 1e9, with no cast error past 2**53 ns."""
    got = seconds_between(pa.array([start], pa.int64()), pa.array([end], pa.int64())).to_pylist()[0]
    assert got == pytest.approx((float(end) - float(start)) / 1e9)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One step, one prompt, two rollouts."""
    return record_run(tmp_path_factory.mktemp("edges"), steps=1, prompts=1, group=2)


@pytest.fixture(scope="module")
def huge_latency_run(small_run: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The small run rewritten so its roots started at the epoch, near int64's ends and at 0: latencies past 2**53 ns."""
    out = os.fspath(tmp_path_factory.mktemp("huge"))
    starts = iter([1, -(2**62), 0, -(2**63) + 1] * 8)
    for f in tracer.list_trace_files(small_run):
        with ipc.open_file(f) as r:
            t = r.read_all()
        roots = t.column(S.PARENT_SPAN_ID).to_pylist()
        start = [next(starts) if p is None else s for s, p in zip(t.column(S.START_NS).to_pylist(), roots, strict=True)]
        i = t.schema.get_field_index(S.START_NS)
        t = t.set_column(i, t.schema.field(i), pa.array(start, t.schema.field(i).type))
        with ipc.new_file(os.path.join(out, os.path.basename(f)), t.schema) as w:
            w.write_table(t)
    return out


@pytest.mark.parametrize("query", [{}, {"step": "1"}, {"step": "1", "sample_index": "0", "view": "group"}])
def test_latency_past_2_53_ns_keeps_every_page(huge_latency_run: str, query: dict[str, str]) -> None:
    """Trajectories whose latency exceeds 2**53 ns leave the overview, the step's list and its group drawn."""
    at = new_app(path=huge_latency_run, **query)
    at.run()
    assert not at.exception
    assert not [e for e in at.error if "Could not draw" in e.value]
    if query.get("step") and not query.get("view"):
        assert len(at.dataframe(key="list_table").value) == 3


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@given(st.text())
def test_terminal_text_leaves_no_control_character(text: str) -> None:
    """Whatever the text, what reaches the terminal is one line with no control, separator or bidi character."""
    shown = terminal_text(text)
    assert not _CONTROL.search(shown)
    if not _CONTROL.search(text) and not re.search("[\u200e\u200f\ud800-\udfff]", text):
        assert shown == text


TAIL_KEYS = [
    "step", "sample", "rollout", "split", "reward", "turns", "tool_calls", "tool_errors", "latency_s", "status", "trace_id",
]  # fmt: skip


def _keys(line: str) -> list[str]:
    """The keys of a logfmt line (values quoted where they hold spaces)."""
    return [field.split("=", 1)[0] for field in shlex.split(line)]


@given(st.text(min_size=1, max_size=30))
def test_tail_line_keeps_one_field_per_key(sample: str) -> None:
    """A sample index with a newline, a space, '=' or an escape sequence cannot forge a line or a field."""
    row: dict[str, Any] = {
        S.STEP: 1,
        S.SAMPLE_INDEX: sample,
        S.ROLLOUT_N: 0,
        S.VALIDATE: False,
        S.REWARD: 0.0,
        S.NUM_LLM_CALLS: 1,
        S.NUM_TOOL_CALLS: 0,
        S.NUM_TOOL_ERRORS: 0,
        S.START_NS: 0,
        S.END_NS: 10**18,
        S.STATUS: "ok",
        S.TRACE_ID: "t",
    }
    line = terminal_text(trajectory_line(row))
    assert "\n" not in line and not _CONTROL.search(line)
    assert _keys(line) == TAIL_KEYS


def test_tail_prints_a_hostile_sample_index_as_one_line(tmp_path: Any) -> None:
    """`tail --trajectories` over a run whose sample index holds a newline and an escape prints one line for it."""
    cfg = tracer.init(project_name="edge", experiment_name="tail", backend="arrow", output_dir=os.fspath(tmp_path))
    with tracer.rollout_trace_attr(sample_index="0\nstep=9 reward=1\x1b[2J", step=1, rollout_n=0):
        _root()
        tracer.log_reward(0.0)
    tracer.flush()
    tracer.shutdown()
    tail = Tail(RunFollower(cfg.run_dir), trajectories=True, grace=0.0)
    tail.saw(tail.follower.poll().changed)
    lines = tail.lines(now=1e12)
    assert len(lines) == 1
    assert "\x1b" not in lines[0] and _keys(lines[0]) == TAIL_KEYS


@tracer.rollout_trace_op(kind="rollout", name="edge_root")
def _root() -> str:
    return "done"


def test_interval_1e309_draws_the_page(small_run: str) -> None:
    """?follow=1&interval=1e309 (a float that overflows to inf) follows at the default interval instead of crashing."""
    at = new_app(path=small_run, follow="1", interval="1e309")
    at.run()
    assert not at.exception
    assert at.session_state[state.SS_INTERVAL] == state.FOLLOW_INTERVAL_S
    assert state.follow_interval("1e308") == state.FOLLOW_INTERVAL_MAX_S
