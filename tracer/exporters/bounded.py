"""Every wait on a backend bounded and said as it goes.

:func:`call_within` runs a call into a sink on a daemon thread, logs every :data:`REPORT_EVERY_S` seconds while
it waits, and at its bound raises :class:`BackendTimeoutError`; :class:`Deadline` is the budget a stop shares.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

logger = logging.getLogger("rollout_trace")

#: Seconds one call into a backend may take when its options give no ``timeout_s``.
CALL_TIMEOUT_S = 120.0
#: Seconds between the "still waiting" lines of a call that has not returned.
REPORT_EVERY_S = 10.0

T = TypeVar("T")


class BackendTimeoutError(TimeoutError):
    """A call into a backend did not return within its bound (the backend hangs or keeps retrying)."""


class Deadline:
    """One point in time that several waits share (None: no bound)."""

    def __init__(self, timeout: float | None) -> None:
        self.at = None if timeout is None else time.monotonic() + max(timeout, 0.0)

    def left(self) -> float | None:
        """Seconds left (never below 0), None without a bound."""
        return None if self.at is None else max(self.at - time.monotonic(), 0.0)


def call_within(fn: Callable[[], T], what: str, timeout_s: float | None, say: Callable[[str], None] | None = None) -> T:
    """``fn()``, waited for at most ``timeout_s`` seconds, with a line every :data:`REPORT_EVERY_S` while waiting;
    ``fn``'s exception is raised as is, BackendTimeoutError (naming ``what``) when it did not return in time."""
    box: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the waiting thread
            box["raised"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"rollout-trace-call: {what[:40]}", daemon=True).start()
    start = time.monotonic()
    report = say or (lambda line: logger.warning("rollout-trace: %s", line))
    while True:
        left = None if timeout_s is None else timeout_s - (time.monotonic() - start)
        if done.wait(REPORT_EVERY_S if left is None else max(min(REPORT_EVERY_S, left), 0.0)):
            break
        waited = time.monotonic() - start
        if timeout_s is not None and waited >= timeout_s:
            raise BackendTimeoutError(f"{what}: no answer within {timeout_s:g} s")
        bound = "" if timeout_s is None else f" (gives up after {timeout_s:g} s)"
        report(f"{what}: still waiting for an answer after {waited:.0f} s{bound}")
    if "raised" in box:
        raise box["raised"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def flush_drivers(drivers: Sequence[Any], timeout: float | None) -> list[str]:
    """Flush every driver within one ``timeout`` in total; return what failed (empty: all written)."""
    deadline = Deadline(timeout)
    problems: list[str] = []
    for driver in drivers:
        try:
            done = driver.flush(deadline.left())
        except Exception as exc:
            done = False
            problems.append(f"{type(driver).__qualname__}: {type(exc).__name__}: {exc}")
        problems.extend(_few(driver.failures()))
        if not done:
            problems.append(
                f"{getattr(driver, 'backend', driver)} exporter: still writing when flush gave up after {timeout:g} s "
                "(its destination is slow or does not answer)"
                if timeout is not None
                else f"{getattr(driver, 'backend', driver)} exporter: its thread has stopped"
            )
    return problems


def shutdown_drivers(drivers: Sequence[Any], timeout: float | None) -> list[str]:
    """Stop every driver within one ``timeout`` in total (they write and close side by side); return what failed."""
    deadline = Deadline(timeout)
    for driver in drivers:
        driver.stop(deadline)
    problems: list[str] = []
    for driver in drivers:
        driver.shutdown(deadline.left())
        problems.extend(_few(driver.failures()))
    return problems


def _few(lines: list[str], keep: int = 3) -> list[str]:
    """The first ``keep`` lines and a count of the rest (a backend down fails every step alike)."""
    return lines if len(lines) <= keep else [*lines[:keep], f"... and {len(lines) - keep} more like them"]
