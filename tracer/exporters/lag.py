"""How far behind the trace files each live exporter is: a small JSON file per process, next to the shards.

A :class:`~tracer.exporters.base.LiveDriver` rewrites ``{run_dir}/_lag.{backend}.{host}_{pid}_{nonce}.json``
every :data:`WRITE_EVERY_S` seconds (through :func:`observe`, which never raises; the last write is ``final``);
:func:`read_lag` reads them for ``rollout-trace info`` and the viewer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import secrets
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tracer.storage import side_files
from tracer.storage import uri as _uri
from tracer.storage.writer import host_label

if TYPE_CHECKING:
    from tracer.exporters.base import LiveDriver

logger = logging.getLogger("rollout_trace")

#: Name prefix and suffix of the lag files.
LAG_PREFIX = "_lag."
LAG_SUFFIX = ".json"
#: Seconds between two writes of a process's lag file.
WRITE_EVERY_S = 5.0
#: Seconds between two looks at the driver's queues (the resolution of "oldest waiting").
OBSERVE_EVERY_S = 1.0
#: A lag file not rewritten for this many write intervals belongs to a process that is gone or stuck.
STALE_AFTER_WRITES = 3


@dataclasses.dataclass
class LagRecord:
    """One live exporter of one process, as its last lag file says (trajectory and span counts)."""

    backend: str
    host: str
    pid: int
    written_at: float  # seconds since the epoch
    shipped: int = 0  # accepted by the backend
    failed: int = 0  # refused after every retry (the files hold them)
    waiting: int = 0  # in the files, not at the backend yet
    oldest_waiting_s: float = 0.0
    running: int = 0  # spans but no root yet: still in rollout, not lag
    queued_spans: int = 0  # handed over, not looked at yet
    dropped_spans: int = 0  # let go by a full queue (export catches up from the files)
    final: bool = False  # written at shutdown: nothing more will come
    every_s: float = WRITE_EVERY_S  # how often its process rewrites it
    path: str = ""

    def stale(self, now: float | None = None) -> bool:
        """Not final and not rewritten for :data:`STALE_AFTER_WRITES` intervals (of at least 1 s): gone or stuck."""
        now = time.time() if now is None else now
        return not self.final and now - self.written_at > STALE_AFTER_WRITES * max(self.every_s, 1.0)

    def describe(self, now: float | None = None) -> str:
        """One line: ``mlflow (host pid 12): 40 shipped, 3 waiting (oldest 12.0 s), ...``."""
        now = time.time() if now is None else now
        oldest = f" (oldest {self.oldest_waiting_s:.1f} s)" if self.waiting else ""
        counts = ((self.failed, "failed"), (self.queued_spans, "spans queued"), (self.dropped_spans, "spans dropped"))
        parts = [f"{self.shipped} shipped", f"{self.waiting} waiting{oldest}", *(f"{n} {w}" for n, w in counts if n)]
        age = max(now - self.written_at, 0.0)
        state = "finished" if self.final else f"updated {age:.0f} s ago"
        if self.stale(now):  # never when final
            state = f"no update for {age:.0f} s: the process is gone or stuck"
        behind = ""
        if (self.failed or self.dropped_spans or (self.final and self.waiting)) and os.path.dirname(self.path):
            behind = f"; catch up: rollout-trace export {os.path.dirname(self.path)} --to {self.backend}"
        return f"{self.backend} ({self.host} pid {self.pid}): {', '.join(parts)}; {state}{behind}"


@dataclasses.dataclass(frozen=True)
class DriverProgress:
    """What a live driver has shipped and holds at one moment (:meth:`LiveDriver.progress`), like :class:`LagRecord`."""

    shipped: int
    failed: int
    in_grace: Mapping[str, float]  # root arrived, grace period running: id -> when (monotonic)
    held: tuple[str, ...]  # finished, held until their step is complete
    running: int
    queued_spans: int
    dropped_spans: int


class _Reporter:
    """The lag file of one driver: remembers since when each waiting trajectory waits."""

    def __init__(self, run_dir: str, backend: str) -> None:
        self.path = os.path.join(
            run_dir, f"{LAG_PREFIX}{backend}.{host_label()}_{os.getpid()}_{secrets.token_hex(3)}{LAG_SUFFIX}"
        )
        self.backend = backend
        self.since: dict[str, float] = {}
        self.last_look = self.last_write = -1e18
        self.failed = False

    def look(self, driver: LiveDriver, final: bool) -> None:
        now = time.monotonic()
        if not final and now - self.last_look < OBSERVE_EVERY_S:
            return
        self.last_look = now
        progress = driver.progress()
        # A held trajectory was in grace at an earlier look: it keeps the time it has waited since.
        self.since = {k: self.since.get(k, progress.in_grace.get(k, now)) for k in {*progress.in_grace, *progress.held}}
        oldest = now - min(self.since.values()) if self.since else 0.0
        if not final and now - self.last_write < WRITE_EVERY_S:
            return
        self.last_write = now
        fields = {k: getattr(progress, k) for k in ("shipped", "failed", "running", "queued_spans", "dropped_spans")}
        fields.update(waiting=len(self.since), oldest_waiting_s=round(max(oldest, 0.0), 3), final=final)
        data = dataclasses.asdict(LagRecord(self.backend, host_label(), os.getpid(), time.time(), **fields))
        del data["path"]  # where the file is, filled in by read_lag
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)


_REPORTERS: weakref.WeakKeyDictionary[LiveDriver, _Reporter] = weakref.WeakKeyDictionary()


def observe(driver: LiveDriver, final: bool = False) -> None:
    """Look at a live driver's progress and, every :data:`WRITE_EVERY_S` (and when ``final``), rewrite its lag file.
    Never raises: a lag file that cannot be written is given up on with one log line."""
    reporter = None
    try:
        reporter = _REPORTERS.get(driver)
        if reporter is None:
            if not driver.run_dir or _uri.is_remote(driver.run_dir):
                return  # an object-store run has no local folder to put the file in
            reporter = _REPORTERS[driver] = _Reporter(driver.run_dir, driver.backend)
        # Not before the run folder is there (it appears with the first shard).
        if not reporter.failed and os.path.isdir(os.path.dirname(reporter.path)):
            reporter.look(driver, final)
    except Exception as exc:
        if reporter is not None:
            reporter.failed = True
        logger.warning(
            "rollout-trace: cannot write the live exporter's lag file (%s: %s); giving up", type(exc).__name__, exc
        )


#: What a value of each annotated type must be in a lag file (a JSON ``true`` is not a number here).
_CHECKS: dict[str, Any] = {
    "str": lambda v: type(v) is str,
    "int": side_files.is_int,
    "float": lambda v: side_files.is_number(v) and math.isfinite(v),
    "bool": lambda v: type(v) is bool,
}
#: What each field of a lag file must be: its :class:`LagRecord` type (``every_s`` also not negative).
_LAG_FIELDS: dict[str, Any] = {f.name: _CHECKS[str(f.type)] for f in dataclasses.fields(LagRecord) if f.name != "path"}
_LAG_FIELDS["every_s"] = lambda v: _CHECKS["float"](v) and v >= 0
_LAG_REQUIRED = ("backend", "host", "pid", "written_at")


def valid_lag(data: Any) -> bool:
    """Whether ``data`` (decoded JSON) is a lag record as :func:`observe` writes it."""
    if not isinstance(data, dict) or not all(k in data for k in _LAG_REQUIRED):
        return False
    return all(check(data[k]) for k, check in _LAG_FIELDS.items() if k in data)


def read_lag(path: str | os.PathLike[str]) -> list[LagRecord]:
    """The lag files under ``path`` (a run folder, searched recursively), by backend, host and pid; files refused
    by :mod:`tracer.storage.side_files` (a FIFO, a link, too large, not a lag record) are named in a warning."""
    root = os.fspath(path)
    if _uri.is_remote(root) or not os.path.exists(root):
        return []
    folder = root if os.path.isdir(root) else os.path.dirname(root) or "."
    found: list[LagRecord] = []
    for d, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(n for n in names if n.startswith(LAG_PREFIX) and n.endswith(LAG_SUFFIX)):
            file = os.path.join(d, name)
            data = side_files.read_json(file, side_files.MAX_LAG_BYTES, valid_lag, "a lag record")
            if data is not None:
                found.append(LagRecord(**{k: v for k, v in data.items() if k in _LAG_FIELDS}, path=file))
    return sorted(found, key=lambda r: (r.backend, r.host, r.pid, r.path))
