"""The Group page: the rollouts of one prompt at one step side by side; a click on a bar opens that rollout."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from viewer import cache, charts, safe, state
from viewer import data as D
from viewer.format import short

#: Below this many bytes of trace files the group view compares the sample across steps by itself.
ACROSS_STEPS_AUTO_BYTES = 8 * 1024 * 1024
#: Rollouts per row.
GROUP_COLUMNS = 4
GROUP_TABLE_COLUMNS = [
    "rollout",
    D.REWARD,
    "advantage",
    D.STATUS,
    "turns",
    "tool calls",
    "tool errors",
    "tools",
    "latency_s",
    D.TRACE_ID,
]


def _on_bar_click() -> None:
    point = state.chart_point("group_chart", charts.PICK_ROLLOUT)
    if point is not None and point.get(D.TRACE_ID):
        state.open_trajectory(str(point[D.TRACE_ID]), state.step())


def draw(path: str, sig: tuple) -> None:
    """Draw the group of the chosen step and sample."""
    ss = st.session_state
    st.header("Group: the rollouts of one prompt")
    step = state.step()
    if step is None:
        st.info("Choose a step in the sidebar to see its groups.")
        return
    traj = cache.table(path, sig, step)
    in_step = D.select(traj, None, state.split_value())
    samples = sorted(
        {s for s in in_step.column(D.SAMPLE_INDEX).to_pylist() if s is not None}, key=lambda s: (len(s), s)
    )
    if not samples:
        st.info("No trajectories at this step.")
        return
    if ss.get(state.SS_SAMPLE) not in samples:
        ss[state.SS_SAMPLE] = samples[0]
    sample = st.selectbox("Sample (prompt)", samples, key=state.SS_SAMPLE)
    g = D.group(traj, step, sample, state.split_value())
    rows = D.list_rows(g)
    st.caption(safe.md(f"step {step} · sample {sample} · {len(rows)} rollout(s)"))
    df = pd.DataFrame(rows)
    if not df.empty:
        st.dataframe(
            df[GROUP_TABLE_COLUMNS],
            hide_index=True,
            key="group_table",
            column_config={
                D.REWARD: st.column_config.NumberColumn(format="%.4g"),
                "advantage": st.column_config.NumberColumn(format="%.4g"),
                "tools": st.column_config.TextColumn(width="large"),
                "latency_s": st.column_config.NumberColumn("latency (s)", format="%.4g"),
            },
        )
        if df[[D.REWARD, "advantage"]].notna().any().any():
            st.caption("Click a bar to replay that rollout.")
            st.altair_chart(
                charts.group_chart(df),
                width="stretch",
                key="group_chart",
                on_select=_on_bar_click,
                selection_mode=charts.PICK_ROLLOUT,
            )
    loaded = cache.group_spans(path, sig, tuple(r[D.TRACE_ID] for r in rows), step)
    cache.warn(loaded["warnings"])
    by_trace = loaded["by_trace"]
    for start in range(0, len(rows), GROUP_COLUMNS):
        cols = st.columns(GROUP_COLUMNS)
        for col, r in zip(cols, rows[start : start + GROUP_COLUMNS]):
            with col, st.container(border=True), safe.isolated("rollout"):
                st.markdown(
                    D.escape_markdown(f"rollout {r['rollout']}")
                    + f" · reward **{short(r[D.REWARD])}** · advantage **{short(r['advantage'])}**"
                )
                st.caption(
                    D.escape_markdown(
                        f"{r[D.STATUS]} · {r['turns']} turns · {r['tool calls']} tool calls ({r['tool errors']} failed)"
                    )
                )
                spans = by_trace.get(r[D.TRACE_ID])
                msgs = D.messages(spans) if spans is not None else []
                final = next((m for m in reversed(msgs) if m.get("role") == "assistant"), None)
                st.caption("final answer")
                tid = r[D.TRACE_ID]
                safe.text(D.content_text(final.get("content")) if final else "(none)", f"final_{tid}", "answer")
                with st.expander("conversation"):
                    for j, m in enumerate(msgs):
                        with safe.isolated("message"):
                            st.caption(safe.md(m.get("role")))
                            safe.text(D.content_text(m.get("content")) or "(tool call)", f"m{j}_{tid}", "message")
                st.button(
                    "Replay",
                    key=f"replay_{r[D.TRACE_ID]}",
                    on_click=state.open_trajectory,
                    args=(r[D.TRACE_ID], r[D.STEP]),
                )
    st.subheader("The same sample across steps")
    # Needs every trajectory of the run: automatic for small runs, one click for big ones.
    small = sum(size for _, size, _ in sig) < ACROSS_STEPS_AUTO_BYTES
    if not st.toggle("Compare with every step (reads the whole run)", value=small, key="across_on"):
        return
    across = D.sample_across_steps(cache.run_base(path, sig).table, sample, state.split_value())
    if across:
        adf = pd.DataFrame(across)
        st.dataframe(adf, hide_index=True, key="across_table")
        if len(adf) > 1:
            st.altair_chart(charts.across_steps_chart(adf), width="stretch")
