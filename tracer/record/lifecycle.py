"""Process exit hooks: make the files durable and drain live exporters before the process goes.

``atexit`` does not run on SIGTERM, SIGHUP or Ray's teardown, so :func:`install` also hooks SIGTERM, SIGINT
and SIGHUP (chaining to the handlers already there) and wraps ``ray.shutdown`` and ``ray.actor.exit_actor``
when Ray is imported. Each hook runs ``drain(timeout)`` on a helper thread and waits at most ``timeout``
(a signal may interrupt a holder of the recorder's locks). ``os._exit``, SIGKILL and actors that Ray ends
from outside cannot be hooked: the files and the next ``rollout-trace export`` keep what they recorded.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("rollout_trace")

#: Signals whose arrival drains the recorder before the previous handler runs.
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))
#: Attribute marking the wrappers this module installed (never wrap twice).
_MARK = "__rollout_trace_drain__"

_drain: Callable[[float], object] | None = None
_timeout_s = 10.0
_lock = threading.Lock()
#: Signal -> the handler that was in force before ours.
_previous: dict[int, Any] = {}


def install(drain: Callable[[float], object], timeout_s: float) -> None:
    """Run ``drain(timeout_s)`` (which must honour its timeout) when this process is told to stop; a second call
    replaces ``drain`` and the bound (the signal handlers and Ray wrappers are installed once)."""
    global _drain, _timeout_s
    with _lock:
        _drain, _timeout_s = drain, float(timeout_s)
    # signal.signal works only on the main thread; atexit and the Ray wrappers still apply elsewhere.
    for sig in SIGNALS if threading.current_thread() is threading.main_thread() else ():
        current = signal.getsignal(sig)
        if current is None or getattr(current, _MARK, False):  # None: installed from C, cannot chain to it
            continue
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, _on_signal)
            _previous[sig] = current
    for module, name in (("ray", "shutdown"), ("ray.actor", "exit_actor")):  # where Ray is imported already
        fn = getattr(sys.modules.get(module), name, None)
        if callable(fn) and not getattr(fn, _MARK, False):
            setattr(sys.modules[module], name, _draining(fn, f"{module}.{name}()"))


def drain_now(reason: str) -> None:
    """Run the installed drain with the configured bound; an overrun or a failure is logged, never raised."""
    with _lock:
        drain, timeout = _drain, _timeout_s
    if drain is None:
        return
    errors: list[BaseException] = []

    def work() -> None:
        try:
            drain(timeout)
        except BaseException as exc:  # the tracer's trouble never stops an exit
            errors.append(exc)

    helper = threading.Thread(target=work, name="rollout-trace-drain", daemon=True)
    helper.start()
    helper.join(timeout)
    if helper.is_alive():
        logger.warning(
            "rollout-trace: %s: gave up draining after %.1f s (shutdown_timeout_s); the files hold what was "
            "recorded up to the last flush: rollout-trace export catches the rest up",
            reason,
            timeout,
        )
    elif errors:
        logger.warning("rollout-trace: %s: drain failed (%s: %s)", reason, type(errors[0]).__name__, errors[0])


def _on_signal(signum: int, frame: Any) -> None:
    drain_now(f"signal {signal.Signals(signum).name}")
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        # Die of the signal as the process would have without us (exit status included).
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    # SIG_IGN: the application ignores it; so do we, after draining.


setattr(_on_signal, _MARK, True)


def _draining(fn: Callable[..., Any], reason: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        drain_now(reason)
        return fn(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper
