"""Following a run in a real browser: the page stays open in headless Chromium and each new step appears, no click.

Served by ``streamlit run`` on 127.0.0.1 and driven over the DevTools protocol
by :mod:`viewer.screenshots`' driver, while the fixture's writer process
records steps. Skipped without Debian's ``chromium``.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlencode

import pytest
from follow_fixtures import WriterProcess

from viewer import state
from viewer.screenshots import chromium, chromium_path, serve, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        chromium_path() is None, reason="headless Chromium is not installed (apt-get install -y chromium)"
    ),
]

#: Generous wait for a rerun on a loaded 2-core machine (not a timing assertion).
WAIT_S = 90


def test_the_open_page_shows_each_new_step_without_a_click(tmp_path: Any) -> None:
    """Steps 2 and 3 written while the page is open appear in the sidebar and the counter, without any input."""
    run_dir = os.path.join(os.fspath(tmp_path), "run")
    os.makedirs(run_dir)
    w = WriterProcess(run_dir)
    try:
        w.say("step 1 2")
        with (
            serve(run_dir, log_path=os.fspath(tmp_path / "streamlit.log")) as base,
            chromium(os.fspath(tmp_path / "chromium")) as browser,
        ):
            query = {state.QP_PATH: run_dir, state.QP_FOLLOW: "1", state.QP_INTERVAL: "1"}
            browser.open(f"{base}/?{urlencode(query)}")
            text = browser.settle("New since you opened")
            assert "New since you opened: 0 step(s)" in text

            def page() -> str:
                return str(browser.evaluate("document.body ? document.body.innerText : ''") or "")

            for step in (2, 3):
                w.say(f"step {step} 2")
                wait_for(
                    lambda step=step: f"New since you opened: {step - 1} step(s)" in page(),
                    WAIT_S,
                    f"step {step} to appear",
                )
            assert state.QP_FOLLOW + "=1" in (browser.evaluate("location.search") or "")
    finally:
        w.close()
