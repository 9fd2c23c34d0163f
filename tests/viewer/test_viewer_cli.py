"""`rollout-trace view` serves the app on 127.0.0.1 and goes away cleanly when stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from viewer_fixtures import record_run

import tracer

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(os.path.dirname(sys.executable), "rollout-trace")
START_TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def run_dir(tmp_path: str) -> Iterator[str]:
    """A small recorded run."""
    yield record_run(tmp_path, steps=1, prompts=1, group=2)
    tracer.shutdown()


@pytest.mark.skipif(
    not os.path.exists(SCRIPT), reason="the rollout-trace console script is not installed (pip install -e .)"
)
def test_view_serves_on_localhost_and_stops_on_sigterm(run_dir: str, tmp_path: str) -> None:
    """The server answers its health check on 127.0.0.1; SIGTERM stops it and frees the port."""
    port = _free_port()
    with open(os.path.join(os.fspath(tmp_path), "view.log"), "wb") as log:
        proc = subprocess.Popen([SCRIPT, "view", run_dir, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            healthy = False
            while time.monotonic() < deadline and proc.poll() is None and not healthy:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                        healthy = r.status == 200
                except OSError:
                    time.sleep(0.5)
            assert healthy, f"no answer from the viewer; see {log.name}"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) is not None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    with socket.socket() as s:
        # SO_REUSEADDR ignores closed connections in TIME_WAIT; a live listener still refuses the bind.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # free again: no server left behind
        s.listen()
