"""The token tab: per-token rollout and trainer numbers, the mismatch under the loss mask, legible cells."""

from __future__ import annotations

import math
import os

import pytest
from apptest_fixtures import all_text, frame_with, open_app
from hypothesis import given
from hypothesis import strategies as st

import tracer
from viewer import data as D

ROLLOUT = [-0.1, -0.5, -2.0, -0.05, -1.5, -0.3]
TRAINER = [-0.2, -0.1, -4.0, -0.05, -1.0, -0.9]
MASK = [1, 1, 0, 1, 0, 1]
ADVANTAGE = 0.75


@tracer.rollout_trace_op(kind="llm", name="generate")
def _generate() -> dict:
    return {"response_ids": list(range(100, 100 + len(ROLLOUT))), "logprobs": ROLLOUT, "finish_reason": "stop"}


@tracer.rollout_trace_op(kind="rollout", name="agent_loop")
def _loop() -> dict:
    _generate()
    return {"messages": [{"role": "user", "content": "Count to six."}, {"role": "assistant", "content": "1 2 3"}]}


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """One trajectory whose single turn has trainer logprobs and a loss mask with zeros; (run dir, trace id)."""
    out = tmp_path_factory.mktemp("tokens")
    cfg = tracer.init(project_name="tok", experiment_name="m", backend="arrow", output_dir=os.fspath(out))
    with tracer.rollout_trace_attr(sample_index=0, step=1, rollout_n=0):
        _loop()
        tracer.log_token_stats(0, old_logprobs=TRAINER, loss_mask=MASK, entropy=[0.5] * 6, source="bf16 vs fp32 pass")
        tracer.log_reward(1.0, advantage=ADVANTAGE)
    tracer.flush()
    tracer.shutdown()
    tid = tracer.read_trajectories(cfg.run_dir).column("trace_id")[0].as_py()
    return cfg.run_dir, tid


def test_mismatch_equals_a_hand_computation_under_the_mask(measured_run: tuple[str, str]) -> None:
    """The token tab's mean |rollout - trainer| counts only the tokens in the loss mask."""
    path, tid = measured_run
    kept = [abs(r - t) for r, t, m in zip(ROLLOUT, TRAINER, MASK, strict=True) if m]
    at = open_app(path, trace_id=tid)
    text = all_text(at)
    assert D.escape_markdown(f"over the {len(kept)} token(s) in the loss mask: {sum(kept) / len(kept):.4g}") in text
    assert "synthetic" not in text.lower()


def test_token_table_has_every_column(measured_run: tuple[str, str]) -> None:
    """The per-token table gives rollout and trainer logprob, difference, ratio, entropy, advantage and mask."""
    path, tid = measured_run
    at = open_app(path, trace_id=tid)
    at.toggle(key="token_table_0").set_value(True).run()
    df = frame_with(at, "trainer logprob")
    assert list(df.columns) == list(D.TOKEN_TABLE_COLUMNS)
    assert list(df["rollout logprob"]) == pytest.approx(ROLLOUT)
    assert list(df["trainer logprob"]) == pytest.approx(TRAINER)
    assert list(df["difference"]) == pytest.approx([r - t for r, t in zip(ROLLOUT, TRAINER, strict=True)])
    assert list(df["ratio"]) == pytest.approx([math.exp(t - r) for r, t in zip(ROLLOUT, TRAINER, strict=True)])
    assert list(df["loss_mask"]) == MASK
    assert set(df["advantage"]) == {ADVANTAGE}


def _luminance(hex_colour: str) -> float:
    def lin(c: int) -> float:
        x = c / 255
        return x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4

    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


@given(
    st.lists(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)), min_size=1, max_size=40),
    st.sampled_from([D.COLOR_LOGPROB, D.COLOR_MISMATCH, "entropy", None]),
)
def test_cell_text_contrasts_with_its_background(values: list[float | None], field: str | None) -> None:
    """Whatever the values, each cell's text colour has a contrast ratio of at least 4.5 with its background."""
    cells = [{D.IN_LOSS: i % 3 != 0, **({field: v} if field else {})} for i, v in enumerate(values)]
    for c in D.paint(cells, field):
        hi, lo = sorted([_luminance(c["bg"]), _luminance(c["ink"])], reverse=True)
        ratio = (hi + 0.05) / (lo + 0.05)
        assert ratio >= 4.5 or not c[D.IN_LOSS], (c, ratio)


def test_synthetic_trainer_stats_are_labelled_where_plotted(demo_dir: str) -> None:
    """The demo's made-up trainer stats are called synthetic on the overview's mismatch charts."""
    at = open_app(demo_dir)
    assert any("(synthetic trainer stats)" in h.value for h in at.subheader)
