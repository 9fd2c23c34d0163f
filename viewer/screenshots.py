"""Regenerate the screenshots in ``docs/viewer.md``: ``python -m viewer.screenshots [OUT_DIR]``.

Records two small runs of the rollout demo (scripted engine, synthetic
trainer stats; the second with a different config and seed), serves the
viewer over them with ``streamlit run`` on 127.0.0.1, loads each page in
headless Chromium (Debian's ``chromium``) driven over the DevTools protocol
with the ``websockets`` client Streamlit already depends on, and writes one
PNG per page (default ``docs/img``). The same driver backs the browser tests.
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
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

from tracer.schema import REWARD, SAMPLE_INDEX, TRACE_ID, VALIDATE
from viewer.cli import streamlit_command

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-port=0",
]
WINDOW = (1400, 1800)
START_TIMEOUT_S = 90
RENDER_TIMEOUT_S = 90
DOCS_IMG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "img")


def chromium_path() -> str | None:
    """Chromium's executable on PATH, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy; raise naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


@contextlib.contextmanager
def serve(path: str, compare: str | None = None, log_path: str | None = None) -> Iterator[str]:
    """``streamlit run viewer/app.py`` over ``path`` on a free port; yields the base URL."""
    port = free_port()
    log = open(log_path or os.devnull, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        streamlit_command(path, "127.0.0.1", port, python=sys.executable, compare=compare),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}; see {log_path or 'its output'}")
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        wait_for(healthy, START_TIMEOUT_S, "the Streamlit server")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class Browser:
    """Just enough of the DevTools protocol: open a page, run JavaScript, click, take a screenshot."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.session: str | None = None

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result."""
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv(timeout=RENDER_TIMEOUT_S))
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))

    def open(self, url: str) -> None:
        """Open ``url`` in a new tab of the window size."""
        target = self.call("Target.createTarget", url="about:blank")
        attached = self.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        self.session = attached["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride", width=WINDOW[0], height=WINDOW[1], deviceScaleFactor=1, mobile=False
        )
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def click(self, x: float, y: float) -> None:
        """A left click at page coordinates (the pointer moves there first, as a hand would: charts track it)."""
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        time.sleep(0.2)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def click_text(self, text: str) -> None:
        """Click the button or tab labelled ``text``."""
        self.evaluate(
            "Array.from(document.querySelectorAll('button, [role=tab]'))"
            f".find(e => e.innerText.trim() === {json.dumps(text)})?.click()"
        )

    def settle(self, wait_for_text: str) -> str:
        """Wait until the page shows ``wait_for_text``, nothing is loading and its text stopped changing."""
        deadline = time.monotonic() + RENDER_TIMEOUT_S
        previous = None
        text = ""
        while time.monotonic() < deadline:
            text = self.evaluate("document.body ? document.body.innerText : ''") or ""
            busy = self.evaluate(
                '!!document.querySelector(\'[data-testid="stStatusWidget"], [data-testid="stSkeleton"]\')'
            )
            if wait_for_text in text and not busy and text == previous:
                return str(text)
            previous = text
            time.sleep(0.5)
        return str(text)

    def screenshot(self) -> bytes:
        """The whole page as PNG (transitions off: capturing beyond the viewport resizes the page)."""
        self.evaluate(
            "document.head.insertAdjacentHTML('beforeend', "
            "'<style>*{transition:none!important;animation:none!important}</style>')"
        )
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        return base64.b64decode(shot["data"])


@contextlib.contextmanager
def chromium(user_data_dir: str) -> Iterator[Browser]:
    """Headless Chromium with a fresh profile, driven over DevTools; stopped on exit."""
    from websockets.sync.client import connect

    exe = chromium_path()
    if exe is None:
        raise RuntimeError("headless Chromium is not installed: apt-get install -y chromium")
    port_file = os.path.join(user_data_dir, "DevToolsActivePort")
    if os.path.exists(port_file):  # a stale file from an earlier browser names the wrong port
        os.remove(port_file)
    size = f"--window-size={WINDOW[0]},{WINDOW[1]}"
    proc = subprocess.Popen(
        [exe, *CHROMIUM_FLAGS, size, f"--user-data-dir={user_data_dir}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def port_line() -> list[str] | None:
            try:
                with open(port_file) as f:
                    parts = f.read().split()
            except OSError:
                return None
            return parts if len(parts) >= 2 else None

        port, path = wait_for(port_line, START_TIMEOUT_S, "Chromium's DevTools port")[:2]
        with connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=30) as ws:
            yield Browser(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def record_demo_runs(out: str) -> tuple[str, str]:
    """Two scripted demo runs under ``out`` (A: seed 0; B: seed 1, another temperature); their run directories.

    The demo records its flags as the run config, so the Compare page shows the two differences.
    """
    from tracer.cli import main

    runs = []
    for name, seed, temperature in (("run-a", "0", "1.0"), ("run-b", "1", "0.7")):
        argv = [
            "demo", "--steps", "4", "--batch", "3", "--n", "4", "--val-every", "2", "--val-size", "2",
            "--out", out, "--experiment", name, "--scripted-latency", "0", "--seed", seed,
            "--temperature", temperature,
        ]  # fmt: skip
        with contextlib.redirect_stdout(sys.stderr):
            if main(argv) != 0:
                raise RuntimeError(f"rollout-trace {' '.join(argv)} failed")
        runs.append(os.path.join(out, "rollout-demo", name))
    return runs[0], runs[1]


#: The pages shot: file name, query, text to wait for, tab to click.
def pages(
    run_a: str, run_b: str, trace_id: str, step: int, sample: str = "0"
) -> list[tuple[str, dict[str, str], str, str | None]]:
    """What :func:`main` shoots (the group page shows ``sample``)."""
    return [
        ("viewer-overview.png", {"view": "overview", "path": run_a}, "Reward per step", None),
        ("viewer-trajectories.png", {"path": run_a, "step": str(step)}, "Rows per page", None),
        ("viewer-replay.png", {"path": run_a, "trace_id": trace_id}, "Trajectory replay", None),
        ("viewer-tokens.png", {"path": run_a, "trace_id": trace_id}, "Trajectory replay", "Tokens"),
        ("viewer-group.png", {"path": run_a, "step": str(step), "sample_index": sample}, "Group", None),
        ("viewer-compare.png", {"view": "compare", "path": run_a, "compare": run_b}, "biggest regression", None),
    ]


def shoot(base: str, shots: list[tuple[str, dict[str, str], str, str | None]], out_dir: str, profile: str) -> list[str]:
    """Load each page and save its screenshot under ``out_dir``; the files written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, query, wait_text, tab in shots:
        with chromium(profile) as b:
            b.open(f"{base}/?{urlencode(query)}")
            b.settle(wait_text)
            if tab:
                b.click_text(tab)
                time.sleep(2.0)
            time.sleep(1.5)  # let charts finish drawing
            file = os.path.join(out_dir, name)
            with open(file, "wb") as f:
                f.write(b.screenshot())
            written.append(file)
    return written


def main(argv: list[str] | None = None) -> int:
    """Record the demo runs, serve the viewer, write the screenshots; print their paths."""
    import tracer

    args = sys.argv[1:] if argv is None else argv
    out_dir = os.path.abspath(args[0]) if args else DOCS_IMG
    with tempfile.TemporaryDirectory(prefix="viewer-shots-") as tmp:
        run_a, run_b = record_demo_runs(os.path.join(tmp, "traces"))
        rows = [r for r in tracer.read_trajectories(run_a, steps=[1]).to_pylist() if not r[VALIDATE]]
        rewards: dict[str, set[float]] = {}
        for r in rows:
            rewards.setdefault(r[SAMPLE_INDEX], set()).add(r[REWARD])
        sample = next((s for s, v in rewards.items() if len(v) > 1), rows[0][SAMPLE_INDEX])  # a group that learns
        first = next(r for r in rows if r[SAMPLE_INDEX] == sample)
        with serve(os.path.dirname(run_a)) as base:
            shots = pages(run_a, run_b, first[TRACE_ID], 1, sample)
            for file in shoot(base, shots, out_dir, os.path.join(tmp, "chromium")):
                print(file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
