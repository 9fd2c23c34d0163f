"""The charts keep their conventions: integer steps, bands inside the data's range, red only for failures."""

from __future__ import annotations

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from tracer.schema import KINDS
from viewer import charts
from viewer import data as D


def test_step_axes_have_integer_ticks_only() -> None:
    """A step axis formats ticks as integers with a minimum step of 1 (never 1.0, 1.2, 1.4)."""
    axis = charts.step_axis().to_dict()["axis"]
    assert axis["format"] == "d" and axis["tickMinStep"] == 1
    df = pd.DataFrame(
        {"step": [1, 2], "split": ["train"] * 2, "reward/mean": [0.5, 0.6], "reward/std": [0.5, 0.4]}
        | {"reward/min": [0.0, 0.0], "reward/max": [1.0, 1.0], "trajectories": [4, 4]}
    )
    spec = charts.reward_chart(df).to_dict()
    assert all(layer["encoding"]["x"]["axis"]["format"] == "d" for layer in spec["layer"])


@given(
    st.lists(
        st.tuples(st.floats(-10, 10), st.floats(0, 10), st.floats(0, 10)).map(
            lambda t: (t[0] - t[1], t[0], t[0] + t[2])  # min <= mean <= max
        ),
        min_size=1,
        max_size=8,
    ),
    st.floats(0, 20),
)
def test_reward_band_never_leaves_the_rewards_range(values: list, std: float) -> None:
    """For any step's min <= mean <= max and any std, the band lies within [min, max]."""
    df = pd.DataFrame(
        {
            "reward/min": [v[0] for v in values],
            "reward/mean": [v[1] for v in values],
            "reward/max": [v[2] for v in values],
            "reward/std": [std] * len(values),
        }
    )
    band = charts.reward_band(df)
    assert (band["reward/lo"] >= band["reward/min"]).all()
    assert (band["reward/hi"] <= band["reward/max"]).all()
    assert (band["reward/lo"] <= band["reward/hi"]).all()


def test_no_span_kind_is_drawn_in_the_failure_colour() -> None:
    """Every kind has its own colour, none of them red; only a failed span gets the red outline."""
    spec = charts.waterfall_spec([{"span": "000 x"}])
    scale = spec["encoding"]["color"]["scale"]
    assert scale["domain"] == list(KINDS)
    assert charts.FAILURE_RED not in scale["range"]
    assert all(not c.lower().startswith(("#d6", "#f00", "#ff0000", "red")) for c in scale["range"])
    assert spec["encoding"]["stroke"]["condition"]["value"] == charts.FAILURE_RED


def test_overview_and_group_charts_select_on_click() -> None:
    """Overview charts pick (step, split) on click; the group chart picks the rollout's trace id."""
    df = pd.DataFrame({"step": [1], "split": ["train"], "turns/mean": [2.0], "tool_calls/mean": [1.0]})
    params = charts.lines_chart(df, ["turns/mean"], "mean").to_dict()["params"]
    assert params[0]["name"] == charts.PICK_STEP and params[0]["select"]["fields"] == ["step", "split"]
    g = pd.DataFrame({"rollout": [0], "trace_id": ["t"], "reward": [1.0], "advantage": [0.5]})
    params = charts.group_chart(g).to_dict()["params"]
    assert params[0]["name"] == charts.PICK_ROLLOUT and "trace_id" in params[0]["select"]["fields"]


def test_token_cells_carry_mismatch_and_mask() -> None:
    """A turn with trainer stats gives each cell the rollout-minus-trainer difference and whether it is trained on."""
    turn = D.TokenTurn(
        name="generate",
        index=0,
        token_ids=[1, 2, 3],
        token_texts=None,
        logprobs=[-0.1, -0.2, None],
        text=None,
        recorded=3,
        truncated=False,
        finish_reason=None,
        prompt_tokens=None,
        stats={"old_logprobs": [-0.1, -1.2, -0.3], "loss_mask": [1, 1, 0], "entropy": [0.0, 1.0, 2.0]},
    )
    cells = turn.cells()
    assert cells[1]["mismatch"] == 1.0 - 0.0 or abs(cells[1]["mismatch"] - 1.0) < 1e-12
    assert cells[2]["mismatch"] is None and cells[2]["in_loss"] is False
    assert cells[0]["entropy"] == 0.0
    assert turn.color_fields() == ["logprob", "mismatch", "old_logprobs", "entropy"]
    assert [w["pos"] for w in D.worst_tokens(turn)] == [1, 0]
