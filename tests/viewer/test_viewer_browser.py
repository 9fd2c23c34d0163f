"""The viewer served by ``streamlit run`` on 127.0.0.1, loaded in headless Chromium.

Needs Debian's ``chromium`` (``apt-get install -y chromium``); skipped without
it. Chromium is driven over the DevTools protocol by :mod:`viewer.screenshots`
(the same driver that makes the docs' screenshots): ``--dump-dom`` alone
returns the page before Streamlit's websocket has delivered any content.

Set ``VIEWER_SCREENSHOT_DIR`` to keep the screenshot; otherwise it lands in
the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from viewer_fixtures import HOSTILE_TEXT, record_run

import tracer
from viewer.screenshots import RENDER_TIMEOUT_S, chromium, chromium_path, serve, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = chromium_path()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``streamlit run viewer/app.py`` over a recorded run: (base URL, run dir)."""
    run_dir = record_run(tmp_path_factory.mktemp("browser_run"))
    tracer.shutdown()
    log = os.fspath(tmp_path_factory.mktemp("logs") / "streamlit.log")
    with serve(run_dir, log_path=log) as base:
        yield base, run_dir


def _load_page(url: str, wait_for_text: str, user_data_dir: str) -> dict[str, Any]:
    """Load ``url`` in headless Chromium until ``wait_for_text`` shows; return text, HTML and a PNG."""
    with chromium(user_data_dir) as b:
        b.open(url)
        b.settle(wait_for_text)
        time.sleep(1.0)  # let charts finish drawing before the screenshot
        return {
            "text": b.evaluate("document.body.innerText") or "",
            "html": b.evaluate("document.documentElement.outerHTML") or "",
            "scripts": b.evaluate("Array.from(document.scripts).map(s => s.textContent).join('\\n')") or "",
            "png": b.screenshot(),
        }


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install -y chromium)")
def test_deep_link_renders_the_replay_in_a_browser(server: tuple[str, str], tmp_path: Any) -> None:
    """A ?trace_id= deep link renders the conversation in Chromium; model HTML stays text; a screenshot is saved."""
    base, run_dir = server
    rows = tracer.read_trajectories(run_dir, steps=[1]).to_pylist()
    tid = next(r["trace_id"] for r in rows if r["sample_index"] == "0" and r["rollout_n"] == 0)
    page = _load_page(f"{base}/?trace_id={tid}", "What is 0 + 0?", os.fspath(tmp_path / "chromium"))
    out_dir = os.environ.get("VIEWER_SCREENSHOT_DIR") or os.fspath(tmp_path)
    os.makedirs(out_dir, exist_ok=True)
    shot = os.path.join(out_dir, "viewer_replay.png")
    with open(shot, "wb") as f:
        f.write(page["png"])
    assert page["png"][:8] == b"\x89PNG\r\n\x1a\n"
    assert "Trajectory replay" in page["text"]
    assert "What is 0 + 0?" in page["text"]
    assert "calculator" in page["text"]
    # The model's "<script>" arrives as text: visible literally, never as an element.
    assert HOSTILE_TEXT in page["text"]
    assert "alert('x')" not in page["scripts"]
    assert "<b>raw</b>" not in page["html"]


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install -y chromium)")
def test_selecting_a_row_of_the_list_opens_its_replay(server: tuple[str, str], tmp_path: Any) -> None:
    """Clicking the first row's selector in the trajectory list opens that trajectory and puts it in the URL."""
    base, run_dir = server
    with chromium(os.fspath(tmp_path / "chromium")) as b:
        b.open(f"{base}/?step=2")
        b.settle("Rows per page")
        box = json.loads(
            b.evaluate(
                "JSON.stringify(document.querySelector('[data-testid=\"stDataFrame\"]').getBoundingClientRect())"
            )
        )
        # The grid is a canvas: click the selection cell of the first data row (below the ~35 px header).
        x, y = box["x"] + 18, box["y"] + 35 + 17
        b.click(x, y)
        text = b.settle("Trajectory replay")
        wait_for(
            lambda: "trace_id=" in (b.evaluate("location.search") or ""),
            RENDER_TIMEOUT_S,
            "the URL to name the trajectory",
        )
        query = b.evaluate("location.search")
    first = tracer.read_trajectories(run_dir, steps=[2]).column("trace_id")[0].as_py()
    assert "Trajectory replay" in text
    assert f"trace_id={first}" in query
