"""rollout-trace viewer: a Streamlit app that replays recorded trajectories.

Run it with ``rollout-trace view PATH`` (``rollout-trace view RUN_A RUN_B``
opens the comparison), or ``streamlit run viewer/app.py -- --path PATH``.
The trace path comes from the ``path`` query parameter, the ``--path``
script argument, or ``ROLLOUT_TRACE_DIR``.

Deep links: ``?step=3`` opens step 3's trajectory list, ``?step=3&sample_index=7``
that prompt's group, ``?trace_id=...`` the trajectory's replay,
``?view=compare&path=RUN_A&compare=RUN_B`` (``&step_a=&step_b=``) the
comparison; ``view=`` (overview, trajectories, replay, group, compare) picks
a page explicitly; ``?follow=1&interval=3`` follows the run while it is
written (``rollout-trace view RUN --follow``, :mod:`viewer.views.live`).

This module is the entry and the routing only: the URL and session state are
in :mod:`viewer.state`, cached readers in :mod:`viewer.cache`, charts in
:mod:`viewer.charts`, one module per page in :mod:`viewer.views`, the data in
:mod:`viewer.data`. Everything a model wrote is shown as text (``st.text``,
``st.code``, data frames, chart labels) or escaped Markdown; nothing is
rendered as HTML.
"""

from __future__ import annotations

import os
import sys
import traceback

import streamlit as st

from viewer import cache, safe, state
from viewer import data as D
from viewer.views import compare, group, live, overview, replay, trajectories

PAGES = {
    "Overview": overview.draw,
    "Trajectories": trajectories.draw,
    "Replay": replay.draw,
    "Group": group.draw,
}


def _show_warnings(box: object) -> None:
    for m in cache.WARNINGS:
        box.warning(  # type: ignore[attr-defined]
            "Trace file read up to its last complete batch (damaged, or still being written): " + safe.md(m, 2000)
        )


def _choose_run(path: str, sig: tuple) -> tuple[str, tuple]:
    """When PATH holds several runs (directories of trace files), pick one: newest by default, or ?run=."""
    dirs = D.run_dirs(sig)
    if len(dirs) < 2:
        return path, sig
    ss = st.session_state
    names = [os.path.relpath(d, path) for d in dirs]
    if ss.get(state.SS_RUN) not in [*names, state.ALL_RUNS]:
        wanted = state.parse_param(st.query_params.get(state.QP_RUN), str)
        ss[state.SS_RUN] = wanted if wanted in names or wanted == state.ALL_RUNS else names[0]
    label = "Run A" if ss.get(state.SS_VIEW) == "Compare" else "Run"
    choice = st.sidebar.selectbox(
        label, [*names, state.ALL_RUNS], key=state.SS_RUN, help="runs under PATH, newest first"
    )
    if choice == state.ALL_RUNS:
        return path, sig
    chosen = os.path.join(path, choice)
    return chosen, D.file_signature(chosen)


def _follow_replayed_step(path: str, sig: tuple, steps: list[int]) -> None:
    """On the Replay page, the sidebar's step is the replayed trajectory's (never "all steps" for a step-1 rollout)."""
    ss = st.session_state
    tid = (ss.get(state.SS_TRACE) or "").strip()
    if ss.get(state.SS_VIEW) != "Replay" or not tid:
        return
    row, _ = replay.trajectory_row(path, sig, tid)
    if row is not None and row[D.STEP] in steps:
        ss[state.SS_STEP] = row[D.STEP]


def server_roots(argv: list[str]) -> list[str]:
    """The directories ``?path=`` may open: ``--path``, ``--compare``, each ``--allow-path`` (``os.pathsep``-separated)."""
    allow = (state.script_arg(argv, "allow-path") or "").split(os.pathsep)
    return D.allowed_roots([state.script_arg(argv, "path"), state.script_arg(argv, "compare"), *allow])


def main() -> None:
    """Draw the app."""
    st.set_page_config(page_title="rollout-trace viewer", layout="wide")
    argv = sys.argv[1:]
    state.init_state(state.script_arg(argv, "compare"), state.script_arg(argv, "follow"))
    ss = st.session_state
    cache.WARNINGS.clear()
    url_path = state.parse_param(st.query_params.get(state.QP_PATH), str)
    arg_path = state.script_arg(argv, "path")
    path = D.resolve_path(url_path, [arg_path] if arg_path else [])
    roots = server_roots(argv)
    state.ROOTS[:] = roots
    st.sidebar.title("rollout-trace")
    if path is None:
        st.info(
            "No trace path given. Start the viewer with `rollout-trace view PATH`, add `?path=PATH` to the URL, "
            "or set ROLLOUT_TRACE_DIR."
        )
        return
    st.sidebar.caption(safe.md(path))
    try:
        D.check_allowed(path, roots)
        root_sig = D.file_signature(path)
    except D.ViewerPathError as exc:
        st.error(safe.md(str(exc), 2000))
        live.watch(path, ())  # following a run about to start: its first file reruns the page
        return
    root = path
    path, sig = _choose_run(root, root_sig)
    live.sidebar(path)
    warn_box = st.container()
    steps_loaded = cache.steps(path, sig)
    cache.warn(steps_loaded.warnings)
    steps = steps_loaded.table.column(D.STEP).to_pylist()
    if not steps and cache.run_base(path, sig).table.num_rows == 0:
        _show_warnings(warn_box)
        st.info(safe.md(f"The trace files under {path} hold no readable trajectories yet."))
        live.watch(path, sig)
        return
    if ss.get(state.SS_STEP) not in steps:
        ss[state.SS_STEP] = state.ALL_STEPS
    _follow_replayed_step(path, sig, steps)
    st.sidebar.radio("View", state.PAGES, key=state.SS_VIEW)
    if ss[state.SS_VIEW] != "Compare":
        st.sidebar.selectbox(
            "Step",
            [state.ALL_STEPS, *steps],
            format_func=lambda s: s if s == state.ALL_STEPS else f"step {s}",
            key=state.SS_STEP,
        )
    st.sidebar.radio("Split", state.SPLITS, key=state.SS_SPLIT, horizontal=True)
    st.sidebar.button(
        "Reload files", on_click=st.cache_resource.clear, help="Drop cached tables and re-read the trace files"
    )
    view = ss[state.SS_VIEW]
    try:
        if view == "Compare":
            compare.draw(path, sig, root, root_sig)
        else:
            PAGES[view](path, sig)
    except Exception as exc:  # one broken record must not take the page down
        st.error(safe.md(f"Could not draw this view: {type(exc).__name__}: {exc}", 2000))
        with st.expander("details"):
            st.code(safe.clip(traceback.format_exc(), safe.MAX_ELEMENT_CHARS), language="python")
    _show_warnings(warn_box)
    state.sync_query_params(url_path)
    live.watch(path, sig)


main()
