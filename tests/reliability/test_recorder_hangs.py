"""The rollout never hangs on the tracer (issue 12, item 3).

A user ``__repr__`` that blocks forever, a full buffer in ``block`` mode, and a
decorated call made from a signal handler while the main thread records:
each scenario runs in a subprocess with a timeout, so a regression fails
instead of hanging the suite. Figures: calls made, spans written, dropped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from reliability_fixtures import FIGURES, python_env

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("figures_report")]

LIMIT_S = 120


def _run(script: str, out: str) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), out],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        env=python_env(ROLLOUT_TRACE_STRICT="0"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    return dict(json.loads(last))


BLOCKING_REPR = """
import json, sys, threading
import tracer
from tracer.record import capture, recorder
capture.USER_CALL_TIMEOUT_S = 0.5
recorder.MAX_STALL_WAIT_S = 1.0

class Stuck:
    __slots__ = ()
    def __repr__(self):
        threading.Event().wait()  # never returns
        return "never"

@tracer.rollout_trace_op
def tool(x):
    return 1

tracer.init(output_dir=sys.argv[1], max_buffered_spans=50, flush_interval_s=0.05)
for i in range(400):
    tool(Stuck() if i % 100 == 0 else i)
r = tracer.flush(timeout=30)
print(json.dumps({"calls": 400, "written": r.spans_written, "dropped": r.spans_dropped, "ok": r.ok}))
"""


@pytest.mark.slow
def test_a_blocking_repr_neither_stalls_the_writer_nor_the_caller(tmp_path: object) -> None:
    """Arguments whose repr never returns: calls return, the spans are written with a placeholder."""
    figures = _run(BLOCKING_REPR, str(tmp_path))
    assert figures["written"] + figures["dropped"] == figures["calls"]
    assert figures["written"] >= figures["calls"] // 2
    FIGURES["blocking __repr__"] = figures


STALLED_WRITER = """
import json, sys
import tracer
from tracer.record import recorder
recorder.MAX_STALL_WAIT_S = 0.5
CALLS = 30

@tracer.rollout_trace_op
def tool(x):
    return x

tracer.init(output_dir=sys.argv[1], max_buffered_spans=20, flush_interval_s=60.0)
rec = recorder.ACTIVE
rec._fork_lock.acquire()  # the writer's cycle cannot run: a stall of the tracer's own
import threading
done = threading.Event()
def rollout():
    for i in range(CALLS):  # the buffer's 20, then 10 that each wait MAX_STALL_WAIT_S and drop
        tool(i)
    done.set()
t = threading.Thread(target=rollout); t.start()
returned = done.wait(60)
rec._fork_lock.release()
t.join(30)
r = tracer.flush(timeout=30)
print(json.dumps({"calls": CALLS, "returned": int(returned), "written": r.spans_written, "dropped": r.spans_dropped}))
"""


@pytest.mark.slow
def test_block_mode_waits_a_bounded_time_on_a_stalled_writer_then_drops_and_counts(tmp_path: object) -> None:
    """on_buffer_full="block" with a writer that cannot progress: the rollout goes on; drops are counted."""
    figures = _run(STALLED_WRITER, str(tmp_path))
    assert figures["returned"] == 1
    assert figures["dropped"] > 0 and figures["written"] + figures["dropped"] == figures["calls"]
    FIGURES["stalled writer, block mode"] = figures


SIGNAL_REENTRY = """
import json, signal, sys
import tracer

@tracer.rollout_trace_op
def tool(x):
    return x

handled = [0]
def handler(signum, frame):
    with tracer.rollout_trace_attr(sample_index=f"sig{handled[0]}", step=2):
        tool("from a signal handler")
    handled[0] += 1

tracer.init(output_dir=sys.argv[1], max_buffered_spans=8, flush_interval_s=0.01, max_samples=4)
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
calls = 0
for i in range(20000):
    with tracer.rollout_trace_attr(sample_index=str(i % 50), step=1):
        tool(i)
        calls += 2
signal.setitimer(signal.ITIMER_REAL, 0, 0)
r = tracer.flush(timeout=30)
print(json.dumps({"main calls": 20000, "handler calls": handled[0], "written": r.spans_written}))
"""


@pytest.mark.slow
def test_a_decorated_call_from_a_signal_handler_never_deadlocks(tmp_path: object) -> None:
    """A signal handler that records while the main thread records (tiny buffer, sampling on): the process ends."""
    figures = _run(SIGNAL_REENTRY, str(tmp_path))
    assert figures["handler calls"] > 0
    FIGURES["signal-handler re-entry"] = figures
