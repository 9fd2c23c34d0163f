"""Issue 17 in a real browser: the Compare page, chart-to-rollout clicks and the page defects, in headless Chromium.

Served by ``streamlit run`` on 127.0.0.1 over two recorded runs
(tests/compare_fixtures.py) and driven over the DevTools protocol by
:mod:`viewer.screenshots`' driver. Skipped without Debian's ``chromium``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

import tracer
from viewer import charts
from viewer.screenshots import Browser, chromium, chromium_path, serve, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        chromium_path() is None, reason="headless Chromium is not installed (apt-get install -y chromium)"
    ),
]

#: Texts of every axis of the page's Vega charts (SVG): [{title, labels}].
AXES_JS = """JSON.stringify(Array.from(document.querySelectorAll('.vega-embed svg g.role-axis')).map(a => ({
  title: Array.from(a.querySelectorAll('.role-axis-title text')).map(t => t.textContent).join(' '),
  labels: Array.from(a.querySelectorAll('.role-axis-label text')).map(t => t.textContent)})))"""


@pytest.fixture(scope="module")
def site(compare_runs_dir: tuple[str, str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root, a, b = compare_runs_dir
    log = os.fspath(tmp_path_factory.mktemp("logs") / "streamlit.log")
    with serve(root, log_path=log) as base:
        yield {"base": base, "a": a, "b": b}


@pytest.fixture()
def browser(tmp_path: Any) -> Iterator[Browser]:
    with chromium(os.fspath(tmp_path / "chromium")) as b:
        yield b


def _open(b: Browser, site: dict[str, str], wait_text: str, **query: str) -> str:
    b.open(f"{site['base']}/?{urlencode(query)}")
    return b.settle(wait_text)


def _trace_id(run: str, step: int) -> str:
    return str(tracer.read_trajectories(run, steps=[step]).column("trace_id")[0].as_py())


def test_compare_deep_link_renders_config_differences_and_prompts(site: dict[str, str], browser: Browser) -> None:
    """?view=compare&path=A&compare=B shows the changed setting and the per-prompt table."""
    text = _open(browser, site, "biggest regression", view="compare", path=site["a"], compare=site["b"])
    assert "Configuration differences" in text
    assert "Per prompt, the biggest regression first" in text
    assert "1 worse in B" in text and "1 better in B" in text


def test_step_axes_show_whole_steps_only(site: dict[str, str], browser: Browser) -> None:
    """Every step axis of the overview is labelled with integers (no 1.0, 1.2, 1.4)."""
    _open(browser, site, "Reward per step", path=site["a"])
    wait_for(lambda: browser.evaluate("document.querySelectorAll('.vega-embed svg').length") >= 4, 30, "charts")
    axes = [a for a in json.loads(browser.evaluate(AXES_JS)) if a["title"] == "step"]
    assert len(axes) >= 4
    for axis in axes:
        assert axis["labels"] and all(label.isdigit() for label in axis["labels"]), axis


def test_overview_tiles_show_whole_numbers_and_the_files_span_count(site: dict[str, str], browser: Browser) -> None:
    """No tile value is cut off, and the spans tile is the files' row count (what `check` reports)."""
    _open(browser, site, "Reward per step", path=site["a"])
    cut = browser.evaluate(
        "Array.from(document.querySelectorAll('[data-testid=\"stMetricValue\"]'))"
        ".filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)"
    )
    assert cut == []
    values = browser.evaluate(
        "Array.from(document.querySelectorAll('[data-testid=\"stMetric\"]')).map(e => e.innerText)"
    )
    rows = tracer.read_spans(site["a"], columns=["step"]).num_rows
    assert any(v.split("\n")[0].strip() == "spans" and f"{rows:,}" in v for v in values), values


def test_clicking_a_reward_point_opens_that_steps_trajectories(site: dict[str, str], browser: Browser) -> None:
    """A click on the step-2 point of the reward chart opens the trajectory list of step 2."""
    _open(browser, site, "Reward per step", path=site["a"])
    wait_for(lambda: browser.evaluate("document.querySelectorAll('.vega-embed svg').length") >= 1, 30, "charts")
    points = json.loads(
        browser.evaluate(
            "JSON.stringify(Array.from(document.querySelectorAll('.vega-embed')[0]"
            ".querySelectorAll('g.mark-symbol.role-mark path')).map(p => p.getBoundingClientRect()))"
        )
    )
    assert len(points) >= 2
    right = max(points, key=lambda r: r["x"])  # step 2 is the rightmost point
    browser.click(right["x"] + right["width"] / 2, right["y"] + right["height"] / 2)
    text = browser.settle("Trajectories of step 2")
    assert "Trajectories of step 2" in text
    wait_for(lambda: "step=2" in (browser.evaluate("location.search") or ""), 30, "the URL to name step 2")


def test_clicking_a_group_bar_opens_that_rollout(site: dict[str, str], browser: Browser) -> None:
    """A click on a bar of the group chart opens that rollout's replay."""
    _open(browser, site, "Click a bar", path=site["a"], step="1", sample_index="1")
    wait_for(lambda: browser.evaluate("document.querySelectorAll('.vega-embed svg').length") >= 1, 30, "the chart")
    bar = json.loads(
        browser.evaluate(
            "JSON.stringify(document.querySelectorAll('.vega-embed')[0]"
            ".querySelector('g.mark-rect.role-mark path').getBoundingClientRect())"
        )
    )
    browser.click(bar["x"] + bar["width"] / 2, bar["y"] + bar["height"] / 2)
    assert "Trajectory replay" in browser.settle("Trajectory replay")
    wait_for(lambda: "trace_id=" in (browser.evaluate("location.search") or ""), 30, "the URL to name the rollout")


def test_replay_sidebar_names_the_step_and_the_waterfall_keeps_red_for_failures(
    site: dict[str, str], browser: Browser
) -> None:
    """Replaying a step-1 rollout the sidebar says step 1; no bar of an ok span is filled red."""
    _open(browser, site, "Trajectory replay", path=site["a"], trace_id=_trace_id(site["a"], 1))
    step = browser.evaluate('document.querySelector(\'[data-testid="stSidebar"] input[aria-label="Step"]\').value')
    assert step == "step 1"
    browser.click_text("Timing")
    wait_for(lambda: browser.evaluate("document.querySelectorAll('.vega-embed svg').length") >= 1, 30, "the waterfall")
    fills = browser.evaluate(
        "Array.from(document.querySelectorAll('.vega-embed svg'))"
        ".filter(svg => svg.textContent.includes('ms since the trajectory started'))"
        ".flatMap(svg => Array.from(svg.querySelectorAll('g.mark-rect path')).map(p => p.getAttribute('fill')))"
    )
    assert fills
    assert {f.lower() for f in fills if f} <= {c.lower() for c in charts.KIND_COLORS.values()}
