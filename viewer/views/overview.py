"""The Overview page: run totals and per-step charts; a click on a point opens that step's trajectories.

When following a run, the newest step's rollouts in progress come first and the charts grow as steps arrive.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tracer import schema as S
from tracer.summary import zero_std_fractions
from viewer import cache, charts, safe, state
from viewer import data as D
from viewer.format import metric_value
from viewer.views import live


def _on_click(key: str) -> None:
    point = state.chart_point(key, charts.PICK_STEP)
    if point is not None and state.int_or_none(point.get(D.STEP)) is not None:
        state.open_step(int(point[D.STEP]), point.get("split"))


def _chart(chart: object, key: str) -> None:
    st.altair_chart(chart, width="stretch", key=key, on_select=lambda: _on_click(key), selection_mode=charts.PICK_STEP)


def draw(path: str, sig: tuple) -> None:
    """Draw the overview of the run at ``path``."""
    st.header("Run overview")
    followed = cache.live(path)
    if followed is not None:
        live.in_progress(followed, None)
    # Per-step aggregates, not every trajectory row: the page costs what it shows, not the run.
    loaded = cache.step_partials(path, sig)
    cache.warn(loaded.warnings)
    split = state.split_value()
    parts = D.select_partials(loaded.table, split)
    span_rows = cache.steps(path, sig).rows if split is None else None
    totals = D.totals_of(parts, span_rows)
    cols = st.columns(len(totals))
    for col, (k, v) in zip(cols, totals.items()):
        col.metric(k, f"{v:.1%}" if k == "tool error rate" else metric_value(v))
    stats = cache.token_stats(path, sig)
    if stats is not None:
        cache.warn(stats.warnings)
    rows = D.overview_of(parts, stats.table if stats is not None else None)
    if not rows:
        st.info("No trajectories recorded yet.")
        return
    zero_std = _zero_std(path, sig)
    if zero_std is not None:
        D.with_zero_std(rows, zero_std)
    if followed is not None:
        running = {p[D.STEP] for p in followed.progress() if p["running"]}
        for r in rows:
            r[charts.PARTIAL] = r[D.STEP] in running
        if running:
            st.caption(
                safe.md(
                    f"Step(s) {', '.join(str(s) for s in sorted(running, key=str))} still running: drawn as hollow "
                    "points, off the lines, until their rollouts finish."
                )
            )
    df = pd.DataFrame(rows)
    st.caption("Click a point of a chart to list that step's trajectories.")
    c1, c2 = st.columns(2)
    with c1:
        st.subheader("Reward per step")
        _chart(charts.reward_chart(df), "ov_reward")
    with c2:
        st.subheader("Turns and tool calls per trajectory")
        _chart(charts.lines_chart(df, ["turns/mean", "tool_calls/mean"], "mean"), "ov_turns")
    c3, c4 = st.columns(2)
    with c3:
        st.subheader("Tool error rate")
        _chart(charts.lines_chart(df, ["tool_error_rate"], "tool errors / tool calls", fmt="%"), "ov_tool_errors")
    with c4:
        st.subheader("Latency (s)")
        _chart(charts.lines_chart(df, ["latency_s/p50", "latency_s/p95"], "seconds"), "ov_latency")
    if "logprob_mismatch" in df.columns and df["logprob_mismatch"].notna().any():
        synthetic = D.synthetic_sources(stats.table) if stats is not None else []
        tag = " (synthetic trainer stats)" if synthetic else ""
        c5, c6 = st.columns(2)
        with c5:
            st.subheader("Train/inference logprob mismatch" + tag)
            st.caption("mean |rollout logprob - trainer logprob| over tokens in the loss mask")
            if synthetic:
                st.warning(safe.md("Not measured: the trainer logprobs are made up. Source: " + "; ".join(synthetic)))
            _chart(charts.lines_chart(df, ["logprob_mismatch"], "mean abs. difference"), "ov_mismatch")
        with c6:
            st.subheader("Largest trainer/rollout probability ratio" + tag)
            _chart(charts.lines_chart(df, ["logprob_ratio/max"], "max exp(trainer - rollout)"), "ov_ratio")
    if D.ZERO_STD_COL in df.columns and df[D.ZERO_STD_COL].notna().any():
        c7, _ = st.columns(2)
        with c7:
            st.subheader("Groups with all rewards equal")
            st.caption("fraction of prompts whose rollouts all got the same reward: no learning signal for GRPO")
            _chart(charts.lines_chart(df, [D.ZERO_STD_COL], "fraction of groups", fmt="%"), "ov_zero_std")
    st.subheader("Per step")
    st.dataframe(df, hide_index=True, key="overview_table", column_config=_number_columns(df))
    _staleness(path, sig)


#: Below this many bytes of trace files the overview counts zero-std groups by itself (it reads every trajectory).
ZERO_STD_AUTO_BYTES = 64 * 1024 * 1024


def _zero_std(path: str, sig: tuple) -> dict[tuple[int | None, bool], float] | None:
    """Per (step, validate) the fraction of zero-std groups; None when the user left it off for a big run."""
    small = sum(size for _, size, _ in sig) < ZERO_STD_AUTO_BYTES
    if not small and not st.toggle("Count groups with all rewards equal (reads every trajectory)", key="zero_std_on"):
        return None
    return zero_std_fractions(cache.run_base(path, sig).table)


@st.cache_data(show_spinner=False, max_entries=8)
def _staleness_tables(path: str, sig: tuple) -> tuple[pd.DataFrame, pd.DataFrame]:
    from tracer.integrations.staleness import read_staleness, step_staleness

    table = read_staleness(path)
    per_step = pd.DataFrame(step_staleness(table))
    if not per_step.empty:
        per_step[S.STALENESS] = [", ".join(f"{k}: {v}" for k, v in d.items()) for d in per_step[S.STALENESS]]
    mixed = table.filter(table[S.MIXED_VERSIONS]).to_pandas()
    return per_step, mixed


def _staleness(path: str, sig: tuple) -> None:
    """Each step's staleness (trainer step minus weight version), and the trajectories of more than one version."""
    per_step, mixed = _staleness_tables(path, sig)
    if per_step.empty:
        return  # no weight versions recorded
    st.subheader("Staleness (step minus weight version)")
    st.caption("staleness: count of trajectories per value; mixed_versions: generated by more than one version")
    st.dataframe(per_step, hide_index=True, key="overview_staleness")
    if not mixed.empty:
        st.caption(f"{len(mixed)} trajectories generated by more than one weight version")
        st.dataframe(mixed, hide_index=True, key="overview_mixed_versions")


def _number_columns(df: pd.DataFrame) -> dict[str, object]:
    """Numbers with 4 significant digits, wide enough to read whole."""
    return {
        c: st.column_config.NumberColumn(c, format="%.4g", width="small")
        for c in df.columns
        if c not in (D.STEP, "split") and pd.api.types.is_float_dtype(df[c])
    }
