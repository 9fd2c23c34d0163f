"""`rollout-trace view` serves the app on 127.0.0.1 and goes away cleanly when stopped."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_fixtures import free_port, start_group, wait_answering
from viewer_fixtures import record_run

import tracer

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(os.path.dirname(sys.executable), "rollout-trace")
START_TIMEOUT_S = 90


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
    port = free_port()
    log = Path(tmp_path) / "view.log"
    proc = start_group([SCRIPT, "view", run_dir, "--port", str(port)], log)
    try:
        wait_answering(proc, f"http://127.0.0.1:{port}/_stcore/health", START_TIMEOUT_S, log)
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
