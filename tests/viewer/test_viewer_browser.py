"""The viewer served by ``streamlit run`` on 127.0.0.1, loaded in headless Chromium.

Needs Debian's ``chromium`` (``apt-get install -y chromium``); skipped without
it. Chromium is driven over the DevTools protocol (the ``websockets`` client,
which Streamlit already depends on): ``--dump-dom`` alone returns the page
before Streamlit's websocket has delivered any content.

Set ``VIEWER_SCREENSHOT_DIR`` to keep the screenshot; otherwise it lands in
the test's temporary directory.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from viewer_fixtures import HOSTILE_TEXT, record_run

import tracer
from viewer.cli import streamlit_command

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-port=0",
    "--window-size=1400,1800",
]
START_TIMEOUT_S = 90
RENDER_TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``streamlit run viewer/app.py`` over a recorded run: (base URL, run dir)."""
    run_dir = record_run(tmp_path_factory.mktemp("browser_run"))
    tracer.shutdown()
    port = _free_port()
    log = open(tmp_path_factory.mktemp("logs") / "streamlit.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        streamlit_command(run_dir, "127.0.0.1", port, python=sys.executable), stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"streamlit exited with {proc.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        _wait_for(healthy, START_TIMEOUT_S, "the Streamlit server")
        yield base, run_dir
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class _Browser:
    """Just enough of the DevTools protocol: open a page, read its text, take a screenshot."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.session: str | None = None

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv(timeout=RENDER_TIMEOUT_S))
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url="about:blank")
        attached = self.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        self.session = attached["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=1400, height=1800, deviceScaleFactor=1, mobile=False)
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def screenshot(self) -> bytes:
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        return base64.b64decode(shot["data"])


@contextlib.contextmanager
def _chromium(user_data_dir: str) -> Iterator[_Browser]:
    """Headless Chromium with a fresh profile, driven over DevTools; stopped on exit."""
    from websockets.sync.client import connect

    port_file = os.path.join(user_data_dir, "DevToolsActivePort")
    if os.path.exists(port_file):  # a stale file from an earlier browser names the wrong port
        os.remove(port_file)
    cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def port_line() -> list[str] | None:
            try:
                with open(port_file) as f:
                    parts = f.read().split()
            except OSError:
                return None
            return parts if len(parts) >= 2 else None

        port, path = _wait_for(port_line, START_TIMEOUT_S, "Chromium's DevTools port")[:2]
        with connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=30) as ws:
            yield _Browser(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_settled(b: _Browser, wait_for_text: str) -> str:
    """Wait until the page shows ``wait_for_text``, nothing is loading and its text stopped changing."""
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    previous = None
    text = ""
    while time.monotonic() < deadline:
        text = b.evaluate("document.body ? document.body.innerText : ''") or ""
        busy = b.evaluate('!!document.querySelector(\'[data-testid="stStatusWidget"], [data-testid="stSkeleton"]\')')
        if wait_for_text in text and not busy and text == previous:
            return text
        previous = text
        time.sleep(0.5)
    return text


def _load_page(url: str, wait_for_text: str, user_data_dir: str, click_text: str | None = None) -> dict[str, Any]:
    """Load ``url`` in headless Chromium until ``wait_for_text`` shows; return text, HTML and a PNG.

    ``click_text``: then click the button or tab with this label (e.g. a replay tab).
    """
    with _chromium(user_data_dir) as b:
        b.open(url)
        _wait_settled(b, wait_for_text)
        if click_text:
            b.evaluate(
                "Array.from(document.querySelectorAll('button, [role=tab]'))"
                f".find(e => e.innerText.trim() === {json.dumps(click_text)})?.click()"
            )
            time.sleep(2.0)
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
    with _chromium(os.fspath(tmp_path / "chromium")) as b:
        b.open(f"{base}/?step=2")
        _wait_settled(b, "Rows per page")
        box = json.loads(
            b.evaluate(
                "JSON.stringify(document.querySelector('[data-testid=\"stDataFrame\"]').getBoundingClientRect())"
            )
        )
        # The grid is a canvas: click the selection cell of the first data row (below the ~35 px header).
        x, y = box["x"] + 18, box["y"] + 35 + 17
        for kind in ("mousePressed", "mouseReleased"):
            b.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
        text = _wait_settled(b, "Trajectory replay")
        _wait_for(
            lambda: "trace_id=" in (b.evaluate("location.search") or ""),
            RENDER_TIMEOUT_S,
            "the URL to name the trajectory",
        )
        query = b.evaluate("location.search")
    first = tracer.read_trajectories(run_dir, steps=[2]).column("trace_id")[0].as_py()
    assert "Trajectory replay" in text
    assert f"trace_id={first}" in query
