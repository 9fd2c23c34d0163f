"""Every page in headless Chromium over a demo run: drawn (no skeleton left), questions shown; screenshots kept.

The screenshots are written under pytest's temporary directory
(``.../artifacts/<page>.png``) so a failing run can be looked at.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

import tracer
from tracer.questions import questions_and_answers
from viewer.screenshots import chromium, chromium_path, serve

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        chromium_path() is None, reason="headless Chromium is not installed (apt-get install -y chromium)"
    ),
]


@pytest.fixture(scope="module")
def site(demo_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = os.fspath(tmp_path_factory.mktemp("logs") / "streamlit.log")
    with serve(demo_dir, log_path=log) as base:
        yield base


def _first(demo_dir: str) -> tuple[dict[str, Any], str, str]:
    row = tracer.read_trajectories(demo_dir, steps=[1]).to_pylist()[0]
    question, answer = questions_and_answers(tracer.read_spans(demo_dir, steps=[1]))[row["trace_id"]]
    return row, question, answer


@pytest.mark.parametrize("page", ["overview", "trajectories", "group", "replay", "tokens", "compare"])
def test_each_page_draws_in_a_browser(site: str, demo_dir: str, page: str, tmp_path: Any) -> None:
    """The page settles with its heading, no skeleton or error, and the question where the page names one."""
    row, question, _ = _first(demo_dir)
    queries: dict[str, tuple[dict[str, str], str]] = {
        "overview": ({"view": "overview"}, "Reward per step"),
        "trajectories": ({"step": "1"}, "Rows per page"),
        "group": ({"step": "1", "sample_index": row["sample_index"]}, "Ground truth"),
        "replay": ({"trace_id": row["trace_id"]}, "Trajectory replay"),
        "tokens": ({"trace_id": row["trace_id"]}, "Trajectory replay"),
        "compare": ({"view": "compare", "compare": demo_dir}, "Compared at"),
    }
    query, wait_text = queries[page]
    with chromium(os.fspath(tmp_path / "chromium")) as b:
        b.open(f"{site}/?{urlencode({'path': demo_dir, **query})}")
        text = b.settle(wait_text)
        if page == "tokens":
            b.click_text("Tokens")
            text = b.settle("in the loss mask")
        shot = b.screenshot()
        skeletons = b.evaluate("document.querySelectorAll('[data-testid=\"stSkeleton\"]').length")
    os.makedirs(tmp_path / "artifacts", exist_ok=True)
    (tmp_path / "artifacts" / f"{page}.png").write_bytes(shot)
    assert wait_text in text and skeletons == 0
    assert "Could not draw" not in text and "Traceback" not in text
    if page in ("group", "replay"):  # tables are drawn on a canvas: their text is not in the page's text
        assert question[:40] in text
    if page == "tokens":
        assert "synthetic trainer stats" in text
