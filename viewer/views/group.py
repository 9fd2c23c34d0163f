"""The Group page: the question and ground truth of one prompt at one step, then its rollouts side by side.

Cards come a page at a time ("show more"), and a card's conversation is
sent only when its toggle is on: a group of 64 long-context rollouts costs
what the page shows (``bench/bench_group_page.py``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from tracer.questions import ground_truth
from tracer.summary import zero_std_groups
from viewer import cache, charts, safe, state
from viewer import data as D
from viewer.format import one_line, short
from viewer.views.trajectories import question_columns

#: Below this many bytes of trace files the group view compares the sample across steps by itself.
ACROSS_STEPS_AUTO_BYTES = 8 * 1024 * 1024
#: Rollouts per row.
GROUP_COLUMNS = 4
#: Cards drawn at first, and added by each "show more".
CARDS_PER_PAGE = 8
#: Messages of a conversation drawn at first, and added by each "show more".
MESSAGES_PER_PAGE = 12
#: Samples whose selector label carries their question (more: the index alone, no read).
LABELLED_SAMPLES = 256
#: Characters of the question, the ground truth and a card's final answer drawn in place.
ANSWER_CHARS = 2000
#: The group filter's choices.
ALL_GROUPS, ZERO_STD_GROUPS, SIGNAL_GROUPS = "all groups", "all rewards equal", "rewards differ"
GROUP_TABLE_COLUMNS = [
    D.SHORT_ID_COL,
    "rollout",
    D.REWARD,
    "advantage",
    D.ANSWER_COL,
    D.STATUS,
    "turns",
    "tool calls",
    "tool errors",
    "tools",
    "latency_s",
    D.TRACE_ID,
]
SS_GROUP_FILTER = "group_filter"


def _on_bar_click() -> None:
    point = state.chart_point("group_chart", charts.PICK_ROLLOUT)
    if point is not None and point.get(D.TRACE_ID):
        state.open_trajectory(str(point[D.TRACE_ID]), state.step())


def _more(key: str, step: int) -> None:
    st.session_state[key] = st.session_state.get(key, step) + step


def _clipped(text: str | None, key: str, what: str) -> None:
    """``text`` drawn up to :data:`ANSWER_CHARS`; the rest named (the replay shows it whole)."""
    body = text if text else "(none)"
    if len(body) > ANSWER_CHARS:
        safe.text(body[:ANSWER_CHARS], key, what)
        st.caption(f"… {len(body) - ANSWER_CHARS:,} more characters: replay the rollout to read all of it.")
    else:
        safe.text(body, key, what)


def _samples(in_step: Any) -> tuple[list[str], set[str]]:
    """The step's samples (natural order) and those whose rewards are all equal."""
    samples = sorted(
        {s for s in in_step.column(D.SAMPLE_INDEX).to_pylist() if s is not None}, key=lambda s: (len(s), s)
    )
    groups = zero_std_groups(in_step).to_pylist()
    return samples, {g[D.SAMPLE_INDEX] for g in groups if g["zero_std"]}


def _sample_labels(path: str, sig: tuple, in_step: Any, samples: list[str], step: int) -> dict[str, str]:
    """Each sample's label in the selector: its index and its question (for up to :data:`LABELLED_SAMPLES`)."""
    if len(samples) > LABELLED_SAMPLES:
        return {}
    first: dict[str, str] = {}
    for s, tid in zip(in_step.column(D.SAMPLE_INDEX).to_pylist(), in_step.column(D.TRACE_ID).to_pylist()):
        if s in samples and s not in first:
            first[s] = tid
    qa = cache.questions(path, sig, tuple(first.values()), step) if first else {}
    return {s: f"{s} · {one_line(qa.get(tid, (None, None))[0] or '', 90)}" for s, tid in first.items()}


def _conversation(spans: Any, tid: str) -> None:
    msgs = D.messages(spans) if spans is not None else []
    key = f"msgs_{tid}"
    shown = st.session_state.get(key, MESSAGES_PER_PAGE)
    for j, m in enumerate(msgs[:shown]):
        with safe.isolated("message"):
            st.caption(safe.md(m.get("role")))
            _clipped(D.content_text(m.get("content")) or "(tool call)", f"m{j}_{tid}", "message")
    if len(msgs) > shown:
        st.button(
            f"show more ({len(msgs) - shown} more messages)",
            key=f"more_{key}",
            on_click=_more,
            args=(key, MESSAGES_PER_PAGE),
        )


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
    samples, zero_std = _samples(in_step)
    if not samples:
        st.info("No trajectories at this step.")
        return
    f1, f2 = st.columns([1, 2])
    kind = f1.radio(
        "Groups",
        (ALL_GROUPS, ZERO_STD_GROUPS, SIGNAL_GROUPS),
        key=SS_GROUP_FILTER,
        horizontal=True,
        help="all rewards equal: every advantage is zero, no learning signal for GRPO",
    )
    offered = [s for s in samples if kind == ALL_GROUPS or (s in zero_std) == (kind == ZERO_STD_GROUPS)]
    f1.caption(f"{len(zero_std)} of {len(samples)} groups at step {step} have all rewards equal")
    if not offered:
        st.info(f"No group at step {step} matches '{kind}'.")
        return
    if ss.get(state.SS_SAMPLE) not in offered:
        ss[state.SS_SAMPLE] = offered[0]
    labels = _sample_labels(path, sig, in_step, offered, step)
    sample = f2.selectbox("Sample (prompt)", offered, key=state.SS_SAMPLE, format_func=lambda s: labels.get(s, str(s)))
    g = D.group(traj, step, sample, state.split_value())
    trace_ids = tuple(g.column(D.TRACE_ID).to_pylist())
    loaded = cache.group_spans(path, sig, trace_ids, step)
    cache.warn(loaded["warnings"])
    by_trace = loaded["by_trace"]
    qa = cache.questions(path, sig, trace_ids, step)
    rows = D.list_rows(g, qa)
    question = next((q for q, _ in (qa.get(t, (None, None)) for t in trace_ids) if q), None)
    truth = next((x for x in (ground_truth(v) for v in g.column(D.REWARD_INFO).to_pylist()) if x), None)
    st.subheader("Question")
    _clipped(question, f"question_{step}_{sample}", "question")
    st.markdown("**Ground truth**")
    _clipped(
        truth if truth is not None else "(not recorded: log_reward(..., ground_truth=...) records it)",
        f"truth_{step}_{sample}",
        "ground truth",
    )
    badge = " · :orange-badge[all rewards equal: no learning signal]" if sample in zero_std else ""
    st.markdown(safe.md(f"step {step} · sample {sample} · {len(rows)} rollout(s)") + badge)
    repeats = D.repeated_rollouts(g)
    if repeats:
        st.warning(
            safe.md(
                "Repeated keys: "
                + "; ".join(f"rollout {n} recorded {k} times" for n, k in repeats.items())
                + ". Each attempt is its own row and card (told apart by its id: writer and time)."
            )
        )
    df = pd.DataFrame(rows)
    if not df.empty:
        st.dataframe(
            df[GROUP_TABLE_COLUMNS],
            hide_index=True,
            key="group_table",
            column_config={
                **question_columns(),
                D.ANSWER_COL: st.column_config.TextColumn("final answer", width="large"),
                D.REWARD: st.column_config.NumberColumn(format="%.4g"),
                "advantage": st.column_config.NumberColumn(format="%.4g"),
                "tools": st.column_config.TextColumn(width="small"),
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
    cards_key = f"cards_{step}_{sample}"
    shown = ss.get(cards_key, CARDS_PER_PAGE)
    for start in range(0, min(shown, len(rows)), GROUP_COLUMNS):
        cols = st.columns(GROUP_COLUMNS)
        for col, r in zip(cols, rows[start : min(start + GROUP_COLUMNS, shown)]):
            tid = r[D.TRACE_ID]
            with col, st.container(border=True), safe.isolated("rollout"):
                st.markdown(
                    D.escape_markdown(f"rollout {r['rollout']} · {r[D.SHORT_ID_COL]}")
                    + f" · reward **{short(r[D.REWARD])}** · advantage **{short(r['advantage'])}**"
                )
                st.caption(
                    D.escape_markdown(
                        f"{r[D.STATUS]} · {r['turns']} turns · {r['tool calls']} tool calls ({r['tool errors']} failed)"
                    )
                )
                st.caption("final answer")
                _clipped(qa.get(tid, (None, None))[1], f"final_{tid}", "answer")
                if st.toggle("conversation", key=f"conv_{tid}"):
                    _conversation(by_trace.get(tid), tid)
                st.button("Replay", key=f"replay_{tid}", on_click=state.open_trajectory, args=(tid, r[D.STEP]))
    if len(rows) > shown:
        st.button(
            f"show more ({len(rows) - shown} more rollouts)",
            key="more_cards",
            on_click=_more,
            args=(cards_key, CARDS_PER_PAGE),
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
