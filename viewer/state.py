"""The viewer's state: the URL's query parameters, the session's widget values, and the callbacks that move between pages.

Query parameter names (``view``, ``path``, ``compare``, ``step``, ...) are the
URL's vocabulary and the session-state keys the widgets' names, spelled here
once: they are not column names, the one place the viewer writes such words
as string literals (column names come from :mod:`tracer.schema`).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from viewer.cli import FOLLOW_INTERVAL_BOUNDS, FOLLOW_INTERVAL_S

PAGES = ("Overview", "Trajectories", "Replay", "Group", "Compare")
SPLITS = ("both", "train", "validation")
#: The step selector's "no step" choice.
ALL_STEPS = "all steps"
#: The run selector's "every run together" choice.
ALL_RUNS = "all runs (mixed)"

# URL query parameters (the URL's names, not columns).
QP_VIEW = "view"
QP_PATH = "path"
QP_RUN = "run"
QP_COMPARE = "compare"
QP_STEP = "step"
QP_STEP_A = "step_a"
QP_STEP_B = "step_b"
QP_TRACE_ID = "trace_id"
QP_SAMPLE = "sample_index"
QP_VALIDATE = "validate"
QP_TOKENIZER = "tokenizer"
QP_FOLLOW = "follow"
QP_INTERVAL = "interval"

#: The directories this server may open (set by the app on each run from its arguments).
ROOTS: list[str] = []

# Session state keys.
SS_VIEW = "view"
SS_STEP = "step_sel"
SS_SPLIT = "split"
SS_TRACE = "trace_id"
SS_SAMPLE = "sample_index"
SS_RUN = "run_sel"
SS_COMPARE = "compare_path"
SS_STEP_A = "compare_step_a"
SS_STEP_B = "compare_step_b"
SS_FOLLOW = "follow"
SS_INTERVAL = "follow_interval"
#: True when the server was started with ``--follow`` (pages open following unless the URL says ``follow=0``).
SS_FOLLOW_DEFAULT = "follow_default"
#: The run the follow toggle follows (set by the app on each run).
SS_LIVE_PATH = "_live_path"
#: What the followed run held when this session started following (for "new since you opened").
SS_LIVE_BASE = "_live_base"

#: Seconds between two looks at the files when following (the default, and the bounds of the sidebar's input).
FOLLOW_INTERVAL_MIN_S, FOLLOW_INTERVAL_MAX_S = FOLLOW_INTERVAL_BOUNDS


def script_arg(argv: list[str], name: str) -> str | None:
    """The value of ``--name`` among the script's arguments, or None."""
    flag = f"--{name}"
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


#: Characters of a URL parameter read at most: a longer value is treated as absent.
MAX_PARAM_CHARS = 4096
#: Integer parameters (steps) lie in int64, the step column's type; others are absent.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_param(
    value: Any,
    kind: type,
    *,
    lo: float | None = None,
    hi: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """One URL parameter (or any untrusted text) as ``kind``, or None: the one parser every parameter goes through.

    ``kind`` is ``str`` (the text; one of ``choices`` when given, matched
    case-insensitively), ``int`` (an integer within int64, then clamped to
    ``[lo, hi]``), ``float`` (a finite number clamped to ``[lo, hi]``) or
    ``bool`` (``1/true/yes/on`` or ``0/false/no/off``). A list (a repeated
    parameter) gives its first item; text longer than
    :data:`MAX_PARAM_CHARS`, non-finite numbers and anything unparsable give None.
    """
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if value is None or isinstance(value, bool) and kind is not bool:
        return None
    text = value if isinstance(value, str) else str(value)
    if len(text) > MAX_PARAM_CHARS:
        return None
    text = text.strip()
    if kind is str:
        if choices is None:
            return text
        return next((c for c in choices if c.lower() == text.lower()), None)
    if kind is bool:
        return True if text.lower() in _TRUE else False if text.lower() in _FALSE else None
    try:
        number: float = int(text) if kind is int else float(text)
    except (TypeError, ValueError):
        return None
    if kind is int and not INT_MIN <= number <= INT_MAX:
        return None
    if number != number or number in (float("inf"), float("-inf")):
        return None
    if lo is not None:
        number = max(number, lo)
    if hi is not None:
        number = min(number, hi)
    return int(number) if kind is int else float(number)


def int_or_none(text: Any) -> int | None:
    """``text`` as an int (:func:`parse_param`), or None."""
    result: int | None = parse_param(text, int)
    return result


def follow_interval(text: Any) -> int | None:
    """``text`` as a follow interval in whole seconds, clamped to the sidebar's bounds; None when not a number."""
    value = parse_param(text, float, lo=FOLLOW_INTERVAL_MIN_S, hi=FOLLOW_INTERVAL_MAX_S)
    return None if value is None else int(round(value))


def init_state(compare_arg: str | None, follow_arg: str | None = None) -> None:
    """Seed the widgets' state from the URL once per session (deep links).

    ``follow_arg`` is the server's ``--follow`` value (the interval in seconds), None when not given.
    """
    ss = st.session_state
    if ss.get("_init"):
        return
    qp = st.query_params
    ss["_init"] = True
    follow = parse_param(qp.get(QP_FOLLOW), bool)
    ss[SS_FOLLOW_DEFAULT] = follow_arg is not None
    ss[SS_FOLLOW] = follow is True or (follow is None and follow_arg is not None)
    ss[SS_INTERVAL] = follow_interval(qp.get(QP_INTERVAL)) or follow_interval(follow_arg) or FOLLOW_INTERVAL_S
    step = int_or_none(qp.get(QP_STEP))
    ss[SS_STEP] = ALL_STEPS if step is None else step
    ss[SS_TRACE] = parse_param(qp.get(QP_TRACE_ID), str) or ""
    ss[SS_SAMPLE] = parse_param(qp.get(QP_SAMPLE), str)
    ss[SS_COMPARE] = parse_param(qp.get(QP_COMPARE), str) or compare_arg or ""
    ss[SS_STEP_A] = int_or_none(qp.get(QP_STEP_A))
    ss[SS_STEP_B] = int_or_none(qp.get(QP_STEP_B))
    val = parse_param(qp.get(QP_VALIDATE), bool)
    ss[SS_SPLIT] = "validation" if val is True else "train" if val is False else "both"
    view = parse_param(qp.get(QP_VIEW), str, choices=PAGES)
    if view is None:
        if ss[SS_TRACE]:
            view = "Replay"
        elif ss[SS_SAMPLE] is not None and step is not None:
            view = "Group"
        elif step is not None:
            view = "Trajectories"
        elif ss[SS_COMPARE]:
            view = "Compare"
        else:
            view = "Overview"
    ss[SS_VIEW] = view


def step() -> int | None:
    """The chosen step, None for all steps."""
    s = st.session_state.get(SS_STEP, ALL_STEPS)
    return None if s == ALL_STEPS else s


def split_value() -> bool | None:
    """The chosen split as a validate filter: None (both), False (train), True (validation)."""
    return {"both": None, "train": False, "validation": True}[st.session_state.get(SS_SPLIT, "both")]


def sync_query_params(path_from_url: str | None) -> None:
    """Write the current view into the URL so it can be shared."""
    ss = st.session_state
    view = ss[SS_VIEW]
    qp: dict[str, str] = {QP_VIEW: view.lower()}
    if path_from_url:
        qp[QP_PATH] = path_from_url
    tokenizer = parse_param(st.query_params.get(QP_TOKENIZER), str)
    if tokenizer:
        qp[QP_TOKENIZER] = tokenizer
    if ss.get(SS_RUN):
        qp[QP_RUN] = ss[SS_RUN]
    if step() is not None and view != "Compare":
        qp[QP_STEP] = str(step())
    if ss.get(SS_SPLIT) != "both":
        qp[QP_VALIDATE] = "true" if ss.get(SS_SPLIT) == "validation" else "false"
    if ss.get(SS_FOLLOW):
        qp[QP_FOLLOW] = "1"
        qp[QP_INTERVAL] = str(ss.get(SS_INTERVAL, FOLLOW_INTERVAL_S))
    elif ss.get(SS_FOLLOW_DEFAULT):  # switched off on a server that follows by default: a reload keeps it off
        qp[QP_FOLLOW] = "0"
    if view == "Replay" and ss.get(SS_TRACE):
        qp[QP_TRACE_ID] = ss[SS_TRACE]
    if view == "Group" and ss.get(SS_SAMPLE) is not None:
        qp[QP_SAMPLE] = str(ss[SS_SAMPLE])
    if view == "Compare":
        if ss.get(SS_COMPARE):
            qp[QP_COMPARE] = ss[SS_COMPARE]
        for key, name in ((SS_STEP_A, QP_STEP_A), (SS_STEP_B, QP_STEP_B)):
            if ss.get(key) is not None:
                qp[name] = str(ss[key])
    if dict(st.query_params.to_dict()) != qp:
        st.query_params.from_dict(qp)


# -- moving between pages (button and chart callbacks) ------------------------


def open_trajectory(trace_id: str, step_value: int | None = None) -> None:
    """Show ``trace_id``'s replay."""
    st.session_state[SS_TRACE] = trace_id
    if step_value is not None:
        st.session_state[SS_STEP] = step_value
    st.session_state[SS_VIEW] = "Replay"


def open_group(step_value: int, sample_index: str) -> None:
    """Show the group of (step, sample_index)."""
    st.session_state[SS_STEP] = step_value
    st.session_state[SS_SAMPLE] = sample_index
    st.session_state[SS_VIEW] = "Group"


def open_step(step_value: int, split: str | None) -> None:
    """Show the trajectory list of one step and split."""
    st.session_state[SS_STEP] = step_value
    if split in SPLITS:
        st.session_state[SS_SPLIT] = split
    st.session_state[SS_VIEW] = "Trajectories"


def chart_point(key: str, param: str) -> dict[str, Any] | None:
    """The first point a click selected on the chart drawn with ``key`` (selection parameter ``param``)."""
    event = st.session_state.get(key)
    selection = getattr(event, "selection", None)
    if selection is None and isinstance(event, dict):
        selection = event.get("selection")
    if selection is None:
        return None
    points = selection.get(param) if isinstance(selection, dict) else getattr(selection, param, None)
    if isinstance(points, list) and points and isinstance(points[0], dict):
        return points[0]
    return None
