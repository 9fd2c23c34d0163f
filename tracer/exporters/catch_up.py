"""Shipping, from the files, what the live exporters of processes that ended had not shipped.

A process that ends without its shutdown (a Ray actor at ``ray.shutdown()``) leaves its waiting trajectories in
its files; :func:`catch_up`, in the process that outlives it, waits (bounded) for the writers to be gone and sends
each live backend what it lacks, as ``rollout-trace export`` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.backends import BACKENDS, LOCAL_BACKEND
from tracer.compare import recorded_configs
from tracer.config import TraceConfig
from tracer.exporters.attach import live_options
from tracer.exporters.base import export_files, recorded_backends
from tracer.index.shard import write_index
from tracer.read import list_trace_files
from tracer.record.redact import REDACTED
from tracer.storage import uri as _uri
from tracer.storage.seal import LIVE, SHARD_NAME, seal_if_abandoned

logger = logging.getLogger("rollout_trace")

#: Seconds between two looks at whether a run's writers are gone.
POLL_S = 0.2
#: A file of another host (no lock to test there) counts as ended once unchanged this long. A writer
#: that was only quiet notices its sealed file at its next write and starts a new one (tracer.storage.seal).
OTHER_HOST_QUIET_S = 30.0


@dataclasses.dataclass
class CaughtUp:
    """What :func:`catch_up` did for one run folder and one backend its files were recorded live to."""

    run_dir: str
    backend: str
    sent: int = 0  # trajectories the destination lacked
    present: int = 0  # trajectories it had already (shipped live)
    problem: str = ""  # why not everything was sent; empty when all went

    def describe(self) -> str:
        """One line for the log."""
        command = f"rollout-trace export {self.run_dir} --to {self.backend}"
        if self.problem:
            return f"rollout-trace: {self.backend} not caught up for {self.run_dir}: {self.problem}; later: {command}"
        return (
            f"rollout-trace: caught up {self.sent} trajectories of {self.run_dir} that {self.backend} lacked "
            f"({self.present} were there already, shipped live)"
        )


def runs_written_since(root: str, since: float) -> list[str]:
    """The run folders under ``root`` (local) holding a trace file changed at or after ``since``."""
    if _uri.is_remote(root) or not os.path.isdir(root):
        return []
    found: list[str] = []
    for d, dirs, names in os.walk(root):
        dirs.sort()
        for name in names:
            with contextlib.suppress(OSError):
                if name.endswith(S.FILE_SUFFIX) and os.stat(os.path.join(d, name)).st_mtime >= since:
                    found.append(d)
                    break
    return found


def writers_running(run_dir: str) -> list[str]:
    """The trace files of ``run_dir`` that other processes may still write (the others are sealed on the way)."""
    running = []
    for f in list_trace_files(run_dir):
        name = SHARD_NAME.match(os.path.basename(f))
        if name is not None and int(name.group("pid")) == os.getpid():
            continue  # this process's own: its writer is alive and ships its own
        if seal_if_abandoned(f, OTHER_HOST_QUIET_S, on_sealed=write_index).action == LIVE:
            running.append(f)
    return running


def _without_redacted(value: Any) -> Any:
    """``value`` with every entry the files hold redacted left out (the destination's own default applies)."""
    if isinstance(value, Mapping):
        return {k: _without_redacted(v) for k, v in value.items() if not (isinstance(v, str) and REDACTED in v)}
    return value


def live_backends(run_dir: str) -> dict[str, dict[str, Any]]:
    """Backend -> the options its live exporter had (less redacted values), per backend ``run_dir`` was recorded to."""
    out: dict[str, dict[str, Any]] = {}
    for _, config in recorded_configs(run_dir):
        for name in recorded_backends(config):
            if name == LOCAL_BACKEND or name not in BACKENDS or name in out:
                continue
            given = _without_redacted(config.get("backend_options") or {})
            try:
                options = live_options(name, TraceConfig(backend_options=given))
            except Exception:  # options the files hold that no longer parse: the backend's defaults
                options = {}
            out[name] = {k: v for k, v in options.items() if v is not None}
    return out


def catch_up_run(run_dir: str, deadline: float) -> list[CaughtUp]:
    """Wait (until ``deadline``, monotonic) for ``run_dir``'s writers to be gone, then catch up each live backend."""
    backends = live_backends(run_dir)
    if not backends:
        return []
    while (running := writers_running(run_dir)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if running:
        why = f"{len(running)} of its files are still being written (e.g. {os.path.basename(running[0])})"
        return [CaughtUp(run_dir, name, problem=why) for name in backends]
    done: list[CaughtUp] = []
    for name, options in backends.items():
        try:
            report = export_files(run_dir, name, progress=False, **options)
            done.append(CaughtUp(run_dir, name, sent=report.trajectories_sent, present=report.trajectories_skipped))
        except Exception as exc:  # the backend down, not installed, ...: the files keep everything
            done.append(CaughtUp(run_dir, name, problem=f"{type(exc).__name__}: {exc}"))
    return done


def catch_up(root: str, since: float, timeout_s: float) -> list[CaughtUp]:
    """Catch up every run folder under ``root`` written since ``since`` (epoch seconds), within ``timeout_s``.

    Never raises; logs one line per run and backend (a warning with the ``rollout-trace export`` command when not all
    went). Past ``timeout_s`` it returns what is done.
    """
    results: list[CaughtUp] = []
    runs: list[str] = []
    deadline = time.monotonic() + timeout_s

    def work() -> None:
        try:
            runs.extend(runs_written_since(root, since))
            for run in runs:
                for item in catch_up_run(run, deadline):
                    results.append(item)
                    (logger.warning if item.problem else logger.info)("%s", item.describe())
        except Exception as exc:  # the tracer's own trouble never reaches the caller
            logger.warning("rollout-trace: catching up from the files failed (%s: %s)", type(exc).__name__, exc)

    thread = threading.Thread(target=work, name="rollout-trace-catch-up", daemon=True)
    thread.start()
    thread.join(max(timeout_s, 0.0))
    if thread.is_alive():
        logger.warning(
            "rollout-trace: gave up catching up after %.0f s; the files hold everything: "
            "rollout-trace export RUN_DIR --to BACKEND for %s",
            timeout_s,
            ", ".join(runs) or root,
        )
    return list(results)


__all__ = ["CaughtUp", "catch_up", "catch_up_run", "live_backends", "runs_written_since", "writers_running"]
