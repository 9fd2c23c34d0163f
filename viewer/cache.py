"""Cached readers: the data layer's functions wrapped in Streamlit caches, keyed by the files' signature.

``st.cache_resource`` hands back the same immutable Arrow tables without
pickling them on every rerun (``st.cache_data`` would copy them each time).
A run still being written gets a new signature when a file grows, so cached
views refresh.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from tracer.questions import questions_and_answers
from tracer.summary import TURN_SPAN_COLUMNS
from viewer import data as D
from viewer import state

#: Cache sizes: whole-run tables are few and large, trajectories many and small.
RUN_CACHE_ENTRIES = 4
STEP_CACHE_ENTRIES = 16
SEARCH_CACHE_ENTRIES = 16
TRAJECTORY_CACHE_ENTRIES = 64
#: From this many trace files on, a trace id -> file index is built once so a
#: trajectory is read from its own file(s) only (a run of many rollout workers).
INDEX_MIN_FILES = 3

#: Readers' warnings about damaged files seen during this script run, shown once at the top.
WARNINGS: list[str] = []


def warn(messages: list[str]) -> None:
    """Remember readers' warnings to show at the top of the page."""
    for m in messages:
        if m not in WARNINGS:
            WARNINGS.append(m)


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Reading the run...")
def _live_run(path: str) -> D.LiveRun:
    """One follower per run, shared by every session that follows it."""
    return D.LiveRun(path)


def live(path: str) -> D.LiveRun | None:
    """The followed run when this session follows ``path`` (the sidebar's toggle), else None.

    Its tables replace the readers below: a refresh reads only the new batches.
    """
    ss = st.session_state
    if not ss.get(state.SS_FOLLOW) or ss.get(state.SS_LIVE_PATH) != path:
        return None
    return _live_run(path)


def steps(path: str, sig: tuple) -> D.Loaded:
    """The run's steps and span row count (from the followed run when following)."""
    followed = live(path)
    return followed.steps_loaded() if followed is not None else _steps(path, sig)


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Listing steps...")
def _steps(path: str, sig: tuple) -> D.Loaded:
    return D.list_steps(path)


def run_base(path: str, sig: tuple) -> D.Loaded:
    """Every trajectory of the run (from the followed run when following)."""
    followed = live(path)
    return followed.loaded() if followed is not None else _run_base(path, sig)


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Reading every trajectory of the run...")
def _run_base(path: str, sig: tuple) -> D.Loaded:
    return D.load_trajectories(path)


def step_partials(path: str, sig: tuple) -> D.Loaded:
    """Per-(step, validate) aggregates of every trajectory: what the overview shows (from the followed run when following)."""
    followed = live(path)
    if followed is not None:
        loaded = followed.loaded()
        return D.Loaded(D.partials_of(loaded.table), loaded.warnings)
    return _step_partials(path, sig)


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Reading the run's steps...")
def _step_partials(path: str, sig: tuple) -> D.Loaded:
    return D.load_step_partials(path)


def run(path: str, sig: tuple) -> D.Loaded:
    """Every trajectory of the run with its tools (from the followed run when following)."""
    followed = live(path)
    return followed.loaded() if followed is not None else _run(path, sig)


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Reading the tools of every trajectory...")
def _run(path: str, sig: tuple) -> D.Loaded:
    base = _run_base(path, sig)
    tools = D.tools_by_trajectory(path)
    return D.Loaded(D.with_tools(base.table, tools.table), D.merge_warnings(base.warnings, tools.warnings))


@st.cache_resource(max_entries=STEP_CACHE_ENTRIES, show_spinner="Reading the step's trajectories...")
def step_table(path: str, sig: tuple, step: int) -> D.Loaded:
    return D.load_step(path, step)


def table(path: str, sig: tuple, step: int | None) -> Any:
    """The trajectories of ``step`` (cached per step), or of the whole run when None."""
    followed = live(path)
    if followed is not None:
        loaded = followed.loaded(step)
    else:
        loaded = run(path, sig) if step is None else step_table(path, sig, step)
    warn(loaded.warnings)
    return loaded.table


@st.cache_resource(max_entries=SEARCH_CACHE_ENTRIES, show_spinner="Searching conversations...")
def search(path: str, sig: tuple, text: str, step: int | None) -> D.Loaded:
    return D.search_trace_ids(path, text, None if step is None else [step])


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Indexing which file holds which trajectory...")
def trace_index(path: str, sig: tuple) -> D.Loaded:
    return D.trace_file_index(path)


def files_for(path: str, sig: tuple, trace_ids: tuple[str, ...]) -> list[str] | None:
    """The files holding these trajectories, for runs of many files; None (read all) for small runs."""
    if len(sig) < INDEX_MIN_FILES:
        return None
    followed = live(path)
    if followed is not None:
        return followed.files_of(trace_ids)
    return D.files_of(trace_index(path, sig).table, trace_ids)


@st.cache_resource(max_entries=TRAJECTORY_CACHE_ENTRIES, show_spinner="Reading the trajectory...")
def trajectory(path: str, sig: tuple, trace_id: str, step: int | None) -> D.Loaded:
    return D.load_trajectory(path, trace_id, step, files_for(path, sig, (trace_id,)))


@st.cache_resource(max_entries=TRAJECTORY_CACHE_ENTRIES, show_spinner="Reading the group...")
def group_spans(path: str, sig: tuple, trace_ids: tuple[str, ...], step: int | None) -> dict[str, Any]:
    loaded = D.load_group_spans(path, trace_ids, step, files_for(path, sig, trace_ids))
    return {"by_trace": D.split_by_trace(loaded.table), "warnings": loaded.warnings}


@st.cache_resource(max_entries=TRAJECTORY_CACHE_ENTRIES, show_spinner="Reading the questions and answers...")
def questions(path: str, sig: tuple, trace_ids: tuple[str, ...], step: int | None) -> dict[str, tuple]:
    """(question, final answer) of each trajectory, by trace id (:func:`tracer.questions.questions_and_answers`)."""
    loaded = D.load_group_spans(path, trace_ids, step, files_for(path, sig, trace_ids), columns=TURN_SPAN_COLUMNS)
    warn(loaded.warnings)
    return questions_and_answers(loaded.table)


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Looking for token stats...")
def has_token_stats(path: str, sig: tuple) -> bool:
    return D.has_token_stats(path)


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Reading the token stats...")
def token_stats(path: str, sig: tuple) -> D.Loaded | None:
    """The run's token stats, or None when it logged none."""
    return D.load_token_stats(path) if has_token_stats(path, sig) else None


@st.cache_resource(max_entries=TRAJECTORY_CACHE_ENTRIES, show_spinner="Reading the trajectory's token stats...")
def trajectory_token_stats(path: str, sig: tuple, trace_id: str, step: int | None) -> D.Loaded | None:
    if not has_token_stats(path, sig):
        return None
    return D.load_token_stats(path, steps=None if step is None else [step], rollout_logprobs=False)


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Comparing the runs...")
def comparison(
    path_a: str, sig_a: tuple, path_b: str, sig_b: tuple, step_a: int | None, step_b: int | None
) -> D.Loaded:
    return D.load_comparison(path_a, path_b, None if step_a is None else [step_a], None if step_b is None else [step_b])


@st.cache_resource(max_entries=RUN_CACHE_ENTRIES, show_spinner="Reading the runs' configs...")
def config_differences(path_a: str, sig_a: tuple, path_b: str, sig_b: tuple) -> list[dict[str, Any]]:
    return D.config_differences(path_a, path_b)


@st.cache_resource(max_entries=4, show_spinner="Loading the tokenizer...")
def decoder(tokenizer_path: str) -> Any:
    return D.load_token_decoder(tokenizer_path)
