"""Following a run while it trains: the sidebar's toggle, the timer that reruns the page, what is in progress.

The timer is a Streamlit fragment with ``run_every``: every interval it looks
at the files' sizes (a ``stat`` per file) and, when one changed, reruns the
whole page (``st.rerun``), which reads only the new batches
(:class:`viewer.data.LiveRun`). Widgets keep their keys across reruns, so
the chosen step, trajectory, filters and page stay as they were.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from tracer.exporters.lag import read_lag
from viewer import cache, safe, state
from viewer import data as D
from viewer.format import metric_value


def sidebar(path: str) -> D.LiveRun | None:
    """Draw the follow toggle and interval; when following, refresh the run and show what is new."""
    ss = st.session_state
    ss[state.SS_LIVE_PATH] = path
    st.sidebar.toggle(
        "Follow the run", key=state.SS_FOLLOW, help="re-read new batches on their own while the run is written"
    )
    followed = cache.live(path)
    if followed is None:
        _lag(path)
        return None
    st.sidebar.number_input(
        "every (s)",
        min_value=state.FOLLOW_INTERVAL_MIN_S,
        max_value=state.FOLLOW_INTERVAL_MAX_S,
        step=1,
        key=state.SS_INTERVAL,
    )
    followed.refresh()
    counts = followed.counts()
    base = ss.get(state.SS_LIVE_BASE)
    if not isinstance(base, tuple) or base[0] != path:
        base = ss[state.SS_LIVE_BASE] = (path, counts)
    new = counts.since(base[1])
    st.sidebar.caption(
        f"New since you opened: {metric_value(new.steps)} step(s), {metric_value(new.trajectories)} "
        f"trajectories, {metric_value(new.spans)} spans · read in {1000 * followed.last_refresh_s:.0f} ms"
    )
    _lag(path)
    return followed


def _lag(path: str) -> None:
    """The live exporters' lag files, when the run has any."""
    records = read_lag(path)
    if not records:
        return
    now = time.time()
    behind = sum(r.waiting for r in records if not r.final)
    with st.sidebar.expander(f"Live exporters: {behind} trajectories waiting", expanded=False):
        for r in records:
            st.caption(safe.md(r.describe(now), 2000))


def watch(path: str, sig: tuple) -> None:
    """While following, rerun the page when a file under ``path`` changed (looked at every interval)."""
    ss = st.session_state
    if not ss.get(state.SS_FOLLOW):
        return
    interval = state.follow_interval(ss.get(state.SS_INTERVAL)) or state.FOLLOW_INTERVAL_S

    @st.fragment(run_every=interval)
    def _look() -> None:
        try:
            now = D.file_signature(path)
        except D.ViewerPathError:
            now = ()
        if now != sig:
            st.rerun(scope="app")

    _look()


def in_progress(followed: D.LiveRun, step: int | None) -> None:
    """Rollouts of the newest step (or of ``step``): finished and still running, each running one's spans so far."""
    progress = followed.progress(step)
    if not progress:
        return
    current = progress[-1] if step is None else progress[0]
    running = followed.running_rows(current[D.STEP])
    if not running and step is None and current["abandoned"] == 0:
        st.caption(f"Following: step {current[D.STEP]} has {current['finished']} finished rollouts, none running.")
        return
    label = "no step" if current[D.STEP] is None else f"step {current[D.STEP]}"
    st.subheader(f"In progress: {label}")
    c1, c2, c3 = st.columns(3)
    c1.metric("rollouts finished", metric_value(current["finished"]))
    c2.metric("still running", metric_value(current["running"]))
    c3.metric(
        "no root, writer done", metric_value(current["abandoned"]), help="its shard was closed without a root span"
    )
    if running:
        st.caption("Running trajectories (no root span yet; spans reach the files within the writer's flush interval)")
        st.dataframe(pd.DataFrame(running), hide_index=True, key="live_running")
        ids = [r[D.TRACE_ID] for r in running]
        o1, o2 = st.columns([3, 1])
        o1.selectbox("Open a running trajectory", ids, key="live_pick")
        o2.button("Open", key="live_open", on_click=_open_running)


def _open_running() -> None:
    tid = st.session_state.get("live_pick")
    if tid:
        state.open_trajectory(tid, None)
