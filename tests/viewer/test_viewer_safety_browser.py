"""Issue 6, viewer safety in a real browser: nothing a trajectory holds runs or loads.

Model output, tool output and a span name carry HTML, script, markdown images
and links, an iframe and ANSI escapes, all pointing at a "canary" HTTP server
on 127.0.0.1. The replay page is loaded in headless Chromium; the test checks
that the text is shown literally, that no element was made from it, and that
the canary server received no request at all.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import tracer
from viewer.screenshots import chromium, chromium_path, serve

pytestmark = [pytest.mark.browser, pytest.mark.slow]


class _Canary(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        _Canary.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def canary() -> Iterator[str]:
    """An HTTP server that records every request made to it."""
    _Canary.hits = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Canary)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def hostile(canary: str) -> str:
    return (
        f"<script>fetch('{canary}/script')</script> <img src=\"{canary}/img\" onerror=\"fetch('{canary}/onerror')\"> "
        f"![pixel]({canary}/markdown-image.png) [click me]({canary}/link) "
        f'<iframe src="{canary}/iframe"></iframe> \x1b[31mRED\x1b[0m <b>bold?</b> marker-7731'
    )


def record(run_root: str, text: str) -> str:
    tracer.init(output_dir=run_root, project_name="safety", experiment_name="run")

    @tracer.rollout_trace_op(kind="tool", name="<img src=x onerror=alert(1)>tool")
    async def tool(expression: str) -> str:
        return text

    @tracer.rollout_trace_op(kind="rollout")
    async def agent_loop(question: str) -> dict[str, Any]:
        observation = await tool(text)
        return {
            "messages": [
                {"role": "user", "content": question},
                {"role": "assistant", "content": text},
                {"role": "tool", "name": "calculator", "content": observation},
            ]
        }

    async def main() -> str:
        with tracer.rollout_trace_attr(sample_index=0, step=1) as attr:
            await agent_loop("Is this page safe?")
            tracer.log_reward(1.0)
        return attr.trace_id or ""

    trace_id = asyncio.run(main())
    tracer.shutdown()
    return trace_id


@pytest.mark.skipif(chromium_path() is None, reason="headless Chromium is not installed (apt-get install -y chromium)")
def test_nothing_from_a_trajectory_runs_or_loads(canary: str, tmp_path: Any) -> None:
    """Hostile model/tool output and span names render as text; the canary server gets no request."""
    text = hostile(canary)
    trace_id = record(os.fspath(tmp_path / "traces"), text)
    run_dir = os.fspath(tmp_path / "traces" / "safety" / "run")
    with (
        serve(run_dir, log_path=os.fspath(tmp_path / "streamlit.log")) as base,
        chromium(os.fspath(tmp_path / "chromium")) as b,
    ):
        b.open(f"{base}/?trace_id={trace_id}")
        b.settle("marker-7731")
        time.sleep(3.0)  # give any injected request time to be made
        page_text = b.evaluate("document.body.innerText") or ""
        made = b.evaluate(
            "JSON.stringify(Array.from(document.querySelectorAll('img, iframe, script, a'))"
            f".map(e => e.getAttribute('src') || e.getAttribute('href') || '').filter(u => u.includes({canary!r})))"
        )
    assert _Canary.hits == []
    assert made == "[]"
    assert "marker-7731" in page_text
    assert "<script>" in page_text and "![pixel](" in page_text and "<iframe" in page_text
