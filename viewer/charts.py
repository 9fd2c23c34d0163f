"""The viewer's charts: Altair charts for the overview and group, plain Vega-Lite specs for the replay.

The replay's charts are plain Vega-Lite specs: Altair's schema validation
cost ~0.3 s per trajectory here, more than reading it.

Conventions every chart keeps: steps are integers on the axis (never 1.2);
a band never leaves the range of the values it summarises; red means a
failure only (span kinds get their own, non-red colours).
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from tracer.schema import (
    KIND,
    KIND_LLM,
    KIND_REWARD,
    KIND_ROLLOUT,
    KIND_SPAN,
    KIND_TOOL,
    KINDS,
    NAME,
    REWARD,
    STATUS,
    STATUS_ERROR,
    STEP,
    TRACE_ID,
)
from viewer.data import IN_LOSS, TOKENS_PER_ROW, TokenTurn

#: Selection parameter of the overview charts: a click picks (step, split).
PICK_STEP = "pick_step"
#: Selection parameter of the group chart: a click picks a rollout.
PICK_ROLLOUT = "pick_rollout"
#: Colour of a failure, and only of a failure.
FAILURE_RED = "#d62728"
#: Span kind -> colour: none of them red.
KIND_COLORS = {
    KIND_ROLLOUT: "#9aa5b1",
    KIND_LLM: "#1f77b4",
    KIND_TOOL: "#2ca02c",
    KIND_REWARD: "#9467bd",
    KIND_SPAN: "#bcbd22",
}
#: Height in pixels of one row of the waterfall and of the token grid.
ROW_PX = 30
#: Pixels of a token's text in its cell (longer text is cut with an ellipsis; the tooltip has all of it).
TOKEN_TEXT_PX = 84
#: Token cells the browser is asked to draw at most.
MAX_TOKEN_CELLS = 4096


def step_axis(title: str = STEP) -> alt.X:
    """An x axis of steps with integer ticks only."""
    return alt.X(f"{STEP}:Q", title=title, axis=alt.Axis(format="d", tickMinStep=1))


def reward_band(df: pd.DataFrame) -> pd.DataFrame:
    """``reward/lo`` and ``reward/hi``: mean ± std, clipped to the step's min and max reward."""
    out = df.copy()
    out["reward/lo"] = (out["reward/mean"] - out["reward/std"]).clip(lower=out["reward/min"])
    out["reward/hi"] = (out["reward/mean"] + out["reward/std"]).clip(upper=out["reward/max"])
    return out


def _pick_step() -> Any:
    return alt.selection_point(name=PICK_STEP, fields=[STEP, "split"], on="click")


#: Column of the overview's rows: True for a step whose rollouts are still running (a followed run).
PARTIAL = "partial"


def _finished_and_partial(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of finished steps, and those of steps still running (drawn apart: hollow, off the line)."""
    if PARTIAL not in df.columns:
        return df, df.iloc[0:0]
    partial = df[PARTIAL].fillna(False).astype(bool)
    return df[~partial], df[partial]


def _partial_points(data: pd.DataFrame, y: str, color: str, tooltip: list[Any]) -> alt.Chart:
    """Hollow points for steps still running: shown, but not joined to the finished steps' line."""
    return (
        alt.Chart(data.assign(**{PARTIAL: "still running"}))
        .mark_point(size=110, filled=False, strokeDash=[2, 2], strokeWidth=2)
        .encode(x=step_axis(), y=f"{y}:Q", color=f"{color}:N", tooltip=[*tooltip, PARTIAL])
    )


def reward_chart(df: pd.DataFrame) -> alt.LayerChart:
    """Reward per step (mean line, band clipped to min-max); a click on a point picks that step and split.

    A step still running is a hollow point off the line, so an unfinished step does not read as a dip.
    """
    finished, partial = _finished_and_partial(reward_band(df))
    base = alt.Chart(finished).encode(x=step_axis(), color=alt.Color("split:N"))
    band = base.mark_area(opacity=0.2).encode(y="reward/lo:Q", y2="reward/hi:Q")
    tooltip = [STEP, "split", "reward/mean", "reward/std", "reward/min", "reward/max", "trajectories"]
    line = base.mark_line(point={"size": 80}).encode(
        y=alt.Y("reward/mean:Q", title="reward (mean ± std, within min-max)"), tooltip=tooltip
    )
    chart = band + line.add_params(_pick_step())
    if not partial.empty:
        chart = chart + _partial_points(partial, "reward/mean", "split", tooltip)
    return chart.properties(height=260)


def lines_chart(df: pd.DataFrame, columns: list[str], title: str, fmt: str | None = None) -> alt.Chart:
    """Several per-step means as lines (one per metric, dashed per split); a click picks the step and split.

    A step still running is a hollow point off the lines.
    """
    present = [c for c in columns if c in df.columns]
    ids = [STEP, "split", *([PARTIAL] if PARTIAL in df.columns else [])]
    long = df.melt(id_vars=ids, value_vars=present, var_name="metric").dropna(subset=["value"])
    finished, partial = _finished_and_partial(long)
    y = alt.Y("value:Q", title=title, axis=alt.Axis(format=fmt) if fmt else alt.Axis())
    tooltip = [STEP, "split", "metric", alt.Tooltip("value:Q", format=".4g")]
    chart: Any = (
        alt.Chart(finished)
        .mark_line(point={"size": 80})
        .encode(x=step_axis(), y=y, color="metric:N", strokeDash="split:N", tooltip=tooltip)
        .add_params(_pick_step())
    )
    if not partial.empty:
        chart = chart + _partial_points(partial, "value", "metric", tooltip)
    return chart.properties(height=260)


def group_chart(df: pd.DataFrame) -> alt.Chart:
    """Reward and advantage per rollout as bars; a click on a bar picks the rollout."""
    long = df.melt(id_vars=["rollout", TRACE_ID], value_vars=[REWARD, "advantage"], var_name="metric").dropna(
        subset=["value"]
    )
    pick = alt.selection_point(name=PICK_ROLLOUT, fields=["rollout", TRACE_ID], on="click")
    return (
        alt.Chart(long)
        .mark_bar()
        .encode(
            x=alt.X("rollout:O", axis=alt.Axis(labelAngle=0)),
            xOffset="metric:N",
            y="value:Q",
            color="metric:N",
            tooltip=["rollout", "metric", alt.Tooltip("value:Q", format=".4g"), TRACE_ID],
        )
        .add_params(pick)
        .properties(height=220)
    )


def across_steps_chart(adf: pd.DataFrame) -> alt.LayerChart:
    """One sample's reward across steps: mean line inside its min-max band."""
    base = alt.Chart(adf).encode(x=step_axis())
    return base.mark_area(opacity=0.2).encode(y="reward min:Q", y2="reward max:Q") + base.mark_line(point=True).encode(
        y=alt.Y("reward mean:Q", title="reward (mean, min-max)")
    )


def waterfall_height(rows: list[dict[str, Any]]) -> int:
    """Pixels the waterfall needs."""
    return max(120, ROW_PX * len(rows) + 50)


def waterfall_spec(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Spans as bars from start to end, coloured by kind; a failed span gets a red outline and label."""
    return {
        "mark": {"type": "bar", "strokeWidth": 2},
        "height": waterfall_height(rows),
        "encoding": {
            "x": {"field": "start_ms", "type": "quantitative", "title": "ms since the trajectory started"},
            "x2": {"field": "end_ms"},
            "y": {
                "field": "span",
                "type": "nominal",
                "sort": None,
                "title": None,
                "axis": {"labelOverlap": False, "labelLimit": 400},
            },
            "color": {
                "field": KIND,
                "type": "nominal",
                "scale": {"domain": list(KINDS), "range": [KIND_COLORS[k] for k in KINDS]},
            },
            "stroke": {
                "condition": {"test": f"datum.status === '{STATUS_ERROR}'", "value": FAILURE_RED},
                "value": None,
            },
            "tooltip": [
                {"field": NAME, "type": "nominal"},
                {"field": KIND, "type": "nominal"},
                {"field": STATUS, "type": "nominal"},
                {"field": "duration_ms", "type": "quantitative", "format": ".3f"},
                {"field": "start_ms", "type": "quantitative", "format": ".3f"},
            ],
        },
    }


def token_height(turn: TokenTurn) -> int:
    """Pixels the token grid of ``turn`` needs."""
    return ROW_PX * (max(1, -(-min(turn.kept, MAX_TOKEN_CELLS) // TOKENS_PER_ROW))) + 20


def token_spec(turn: TokenTurn, color_by: str | None, extra_fields: list[str]) -> dict[str, Any]:
    """The token grid: one cell per token, its background from ``color_by`` and its text in a colour legible on it.

    The cells come through :func:`viewer.data.tokens.paint` (fields ``bg``
    and ``ink``); tokens outside the loss mask are grey.
    """
    tooltip = [
        {"field": "pos", "type": "quantitative"},
        {"field": "token", "type": "nominal"},
        {"field": "token_id", "type": "quantitative"},
        {"field": "logprob", "type": "quantitative", "format": ".4f"},
        {"field": "prob", "type": "quantitative", "format": ".3f"},
        {"field": IN_LOSS, "type": "nominal"},
    ] + [{"field": f, "type": "quantitative", "format": ".4f"} for f in extra_fields]
    return {
        "height": token_height(turn),
        "encoding": {
            "x": {"field": "col", "type": "ordinal", "axis": None},
            "y": {"field": "row", "type": "ordinal", "axis": None},
            "tooltip": tooltip,
        },
        "layer": [
            {
                "mark": {"type": "rect", "stroke": "white", "strokeWidth": 2},
                "encoding": {"color": {"field": "bg", "type": "nominal", "scale": None, "legend": None}},
            },
            {
                "mark": {"type": "text", "fontSize": 13, "font": "monospace", "limit": TOKEN_TEXT_PX},
                "encoding": {
                    "text": {"field": "label", "type": "nominal"},
                    "color": {"field": "ink", "type": "nominal", "scale": None, "legend": None},
                },
            },
        ],
    }
