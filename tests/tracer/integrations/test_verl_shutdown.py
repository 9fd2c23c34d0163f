"""Stopping a worker by signal loses none of the spans recorded before it (tracer.record.lifecycle)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from scale_fixtures import REPO

import tracer

SPANS = 200

SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    import tracer

    tracer.init(project_name="p", experiment_name="e", flush_interval_s=3600, shutdown_timeout_s=20)
    handled = []
    if sys.argv[1] == "chain":
        signal.signal(signal.SIGTERM, lambda s, f: handled.append(s))  # the application's own handler
        tracer.init(tracer.get_config())  # installed after the application's: chains to it

    @tracer.rollout_trace_op(kind="llm")
    def generate(i):
        return {"response_ids": [i]}

    for i in range(SPANS):
        with tracer.rollout_trace_attr(sample_index=i, step=1):
            generate(i)
    print("READY", flush=True)
    deadline = time.monotonic() + 60
    while not handled and time.monotonic() < deadline:
        time.sleep(0.05)
    print("HANDLED" if handled else "NOT HANDLED", flush=True)
    """
).replace("SPANS", str(SPANS))


def _stop(trace_dir: str, sig: int, mode: str) -> tuple[int, str]:
    env = {**os.environ, tracer.ENV_TRACE_DIR: trace_dir, "PYTHONPATH": REPO}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out + err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: signal.Signals(s).name)
def test_signal_keeps_every_recorded_span(trace_dir: str, sig: int) -> None:
    """SIGTERM, SIGHUP and SIGINT (default handlers) drain the buffer: 0 of the recorded spans lost."""
    code, out = _stop(trace_dir, sig, "default")
    assert code != 0  # the process still ends as the signal ends it
    assert tracer.read_spans(trace_dir).num_rows == 2 * SPANS, out[-2000:]


def test_signal_chains_to_the_applications_handler(trace_dir: str) -> None:
    """An application's own SIGTERM handler still runs (after the drain), and nothing is lost."""
    code, out = _stop(trace_dir, signal.SIGTERM, "chain")
    assert "HANDLED" in out and "NOT HANDLED" not in out
    assert code == 0
    assert tracer.read_spans(trace_dir).num_rows == 2 * SPANS
