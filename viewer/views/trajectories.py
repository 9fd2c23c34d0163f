"""The Trajectories page: one step's (or the run's) trajectories, filtered, searched, sorted and paged on the server."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow.compute as pc
import streamlit as st

from tracer.questions import describe_repeats, repeated_keys
from viewer import cache, safe, state
from viewer import data as D
from viewer.format import short
from viewer.views import live

PAGE_SIZES = (25, 50, 100, 250)


def _min_max(column: Any) -> tuple[Any, Any]:
    mm = pc.min_max(column)
    return mm["min"].as_py(), mm["max"].as_py()


def _keep_known(ss: Any, key: str, options: list[str]) -> None:
    """Drop choices a previous step offered that this one does not (Streamlit refuses unknown values)."""
    if key in ss:
        ss[key] = [v for v in ss[key] if v in options]


def _keep_in_range(ss: Any, key: str, lo: Any, hi: Any) -> None:
    """Reset a range slider whose remembered range lies outside this step's values.

    A slider left at its whole range follows the range as it grows (a run
    being followed gets new values); one the user narrowed keeps its values.
    """
    value = ss.get(key)
    bounds_key = f"_{key}_bounds"
    whole = ss.get(bounds_key)
    ss[bounds_key] = (lo, hi)
    if value is None:
        return
    if not (lo <= value[0] <= hi and lo <= value[1] <= hi) or (whole is not None and tuple(value) == tuple(whole)):
        del ss[key]


def _row_label(r: dict[str, Any]) -> str:
    return safe.clip(
        f"{r[D.SHORT_ID_COL]} · step {r[D.STEP]} · sample {r['sample']} · rollout {r['rollout']} · "
        f"reward {short(r[D.REWARD])} · {r[D.QUESTION_COL]}"
    )


def question_columns() -> dict[str, Any]:
    """Column settings of the short id, question and answer columns every trajectory table starts with."""
    return {
        D.SHORT_ID_COL: st.column_config.TextColumn("id", width="small", help="the trace id's distinct part"),
        D.QUESTION_COL: st.column_config.TextColumn(
            "question", width="large", help="the last user message before the model's first reply"
        ),
        D.ANSWER_COL: st.column_config.TextColumn("final answer", width="medium", help="the last assistant message"),
    }


def _open_picked() -> None:
    tid = st.session_state.get("pick")
    if tid:
        state.open_trajectory(tid, None)


def _on_list_select() -> None:
    sel = st.session_state.get("list_table")
    rows = getattr(getattr(sel, "selection", None), "rows", None) or (sel or {}).get("selection", {}).get("rows", [])
    ids = st.session_state.get("_page_ids") or []
    if rows and rows[0] < len(ids):
        tid, _ = ids[rows[0]]
        state.open_trajectory(tid, None)


def draw(path: str, sig: tuple) -> None:
    """Draw the trajectory list of the chosen step and split."""
    ss = st.session_state
    step = state.step()
    split = ss.get(state.SS_SPLIT, "both")
    where = f" of step {step}" if step is not None else " (all steps)"
    st.header("Trajectories" + where + ("" if split == "both" else f", {split}"))
    followed = cache.live(path)
    if followed is not None and step is not None:
        live.in_progress(followed, step)
    base = D.select(cache.table(path, sig, step), None, state.split_value())
    if base.num_rows == 0:
        st.info("No trajectories for this step and split.")
        return
    repeats = describe_repeats(repeated_keys(base))
    if repeats:
        st.warning(safe.md(repeats, 1000))
    c1, c2, c3 = st.columns([2, 1, 1])
    query = c1.text_input(
        "Search the conversations", key="q", placeholder="text in any question, answer, prompt, tool call or result"
    )
    statuses = sorted(s for s in pc.unique(base.column(D.STATUS)).to_pylist() if s)
    _keep_known(ss, "f_status", statuses)
    chosen_status = c2.multiselect("Status", statuses, key="f_status")
    tools = D.tool_names(base)
    _keep_known(ss, "f_tools", tools)
    chosen_tools = c3.multiselect("Tool used", tools, key="f_tools")
    c4, c5, c6, c7 = st.columns(4)
    r_lo, r_hi = _min_max(base.column(D.REWARD))
    reward_range = None
    if r_lo is not None and r_lo < r_hi:
        _keep_in_range(ss, "f_reward", float(r_lo), float(r_hi))
        reward_range = c4.slider("Reward", float(r_lo), float(r_hi), (float(r_lo), float(r_hi)), key="f_reward")
    t_lo, t_hi = _min_max(base.column(D.NUM_LLM_CALLS))
    turns_range = None
    if t_lo is not None and t_lo < t_hi:
        _keep_in_range(ss, "f_turns", int(t_lo), int(t_hi))
        turns_range = c5.slider("Turns", int(t_lo), int(t_hi), (int(t_lo), int(t_hi)), key="f_turns")
    sort = c6.selectbox("Sort by", list(D.SORT_COLUMNS), key="sort")
    desc = c7.toggle("Descending", key="desc")
    filters = D.Filters(statuses=chosen_status, tools=chosen_tools)
    if reward_range is not None and reward_range != (r_lo, r_hi):
        filters.reward_min, filters.reward_max = reward_range
    if turns_range is not None:
        filters.turns_min, filters.turns_max = turns_range
    if query.strip():
        found = cache.search(path, sig, query.strip(), step)
        cache.warn(found.warnings)
        filters.trace_ids = found.table.column(D.TRACE_ID).combine_chunks()
    filtered = D.apply_filters(base, filters)
    p1, p2, p3 = st.columns([1, 1, 2])
    page_size = p1.selectbox("Rows per page", PAGE_SIZES, key="page_size")
    pages = max(1, -(-filtered.num_rows // page_size))
    if ss.get("page", 1) > pages:
        ss["page"] = pages
    page = p2.number_input("Page", min_value=1, max_value=pages, step=1, key="page")
    p3.caption(f"{filtered.num_rows:,} of {base.num_rows:,} trajectories match; page {page} of {pages:,}")
    shown, _ = D.sort_and_page(filtered, sort, desc, int(page) - 1, page_size)
    qa = cache.questions(path, sig, tuple(shown.column(D.TRACE_ID).to_pylist()), step) if shown.num_rows else {}
    rows = D.list_rows(shown, qa)
    if followed is not None:
        running = {r[D.TRACE_ID] for r in followed.running_rows(step)}
        for r in rows:
            if r[D.TRACE_ID] in running:
                r[D.STATUS] = "running"
    ss["_page_ids"] = [(r[D.TRACE_ID], r[D.STEP]) for r in rows]
    if not rows:
        st.info("No trajectory matches these filters.")
        return
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        key="list_table",
        on_select=_on_list_select,
        selection_mode="single-row",
        column_config={
            **question_columns(),
            D.TRACE_ID: st.column_config.TextColumn("trace id", width="medium"),
            D.REWARD: st.column_config.NumberColumn(format="%.4g"),
            "advantage": st.column_config.NumberColumn(format="%.4g"),
            D.STATUS: st.column_config.TextColumn(width="small"),
            "tools": st.column_config.TextColumn("tools", width="large"),
            "latency_s": st.column_config.NumberColumn("latency (s)", format="%.4g"),
        },
    )
    o1, o2 = st.columns([3, 1])
    labels = {r[D.TRACE_ID]: _row_label(r) for r in rows}
    o1.selectbox(
        "Open a trajectory (or select a row above)", list(labels), format_func=lambda t: labels.get(t, t), key="pick"
    )
    o2.button("Open", key="open_pick", on_click=_open_picked, type="primary")
