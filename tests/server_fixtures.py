"""Servers the tests run as subprocesses: a free port, a process group started, waited for and stopped, an ``mlflow server``.

One place for the start-and-wait that the MLflow, OTLP, Phoenix and fault
tests share: :func:`serving` for a command run for the length of a ``with``,
:class:`MlflowServer` for an ``mlflow server`` that a test may also kill and
start again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

#: Seconds to wait for an ``mlflow server``'s /health (it needs 10-30 s on a loaded 2-core machine).
MLFLOW_START_TIMEOUT_S = 180.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_group(
    cmd: Sequence[str], log_path: Path, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a process group of its own (to stop it whole), its output appended to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )


def wait_answering(proc: subprocess.Popen[bytes], probe_url: str, timeout_s: float, log_path: Path) -> None:
    """Return once ``probe_url`` answers; raise if ``proc`` exits first (showing its log's end) or ``timeout_s`` passes."""
    args = [str(a) for a in proc.args] if isinstance(proc.args, list) else [str(proc.args)]
    # What was started, as "mlflow server --backend-store-uri" or "python -m moto.server".
    name = " ".join([os.path.basename(args[0]), *args[1:3]])
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(probe_url, timeout=5):  # noqa: S310 - a local server
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not answer {probe_url} in {timeout_s} s; see {log_path}")
        time.sleep(0.5)


def stop_group(proc: subprocess.Popen[bytes], term_first: bool = True) -> None:
    """Stop ``proc``'s process group: SIGTERM (unless not ``term_first``), then SIGKILL for what outlives it.

    An MLflow server's job consumers can outlive a SIGTERM of the server.
    """
    if term_first:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


@contextlib.contextmanager
def serving(
    cmd: Sequence[str], root: Path, probe_url: str, timeout_s: float, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` in ``root`` in a process group of its own; yield once ``probe_url`` answers; stop the whole group.

    Its output goes to ``root/server.log``, whose end an exit before answering shows.
    """
    log_path = root / "server.log"
    proc = start_group(cmd, log_path, cwd=root, env=env)
    try:
        wait_answering(proc, probe_url, timeout_s, log_path)
        yield proc
    finally:
        stop_group(proc)


class MlflowServer:
    """An ``mlflow server`` on 127.0.0.1 keeping everything under ``root``: SQLite store, artifacts, log, cwd.

    ``with MlflowServer(root) as server:`` starts it and stops it at the end;
    :meth:`kill` (SIGKILL of its process group) and :meth:`start` again
    simulate a crash and a restart on the same port and store.
    """

    def __init__(self, root: str | os.PathLike[str], port: int | None = None) -> None:
        self.root = Path(root)
        self.port = free_port() if port is None else port
        self.log = self.root / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """``mlflow server`` with a SQLite store and artifact root in :attr:`root`, one worker."""
        return [
            os.path.join(os.path.dirname(sys.executable), "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.root / 'mlflow.db'}",
            "--default-artifact-root",
            str(self.root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]

    def start(self, timeout_s: float = MLFLOW_START_TIMEOUT_S) -> None:
        """Start the server and wait for its /health."""
        # Without MLflow's GenAI job runner (a second process importing mlflow, which the
        # tracking and trace endpoints do not use): a start takes about half as long here.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.proc = start_group(self.command(), self.log, cwd=self.root, env=env)
        try:
            wait_answering(self.proc, self.uri + "/health", timeout_s, self.log)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the server and its workers (its own process group)."""
        if self.proc is not None and self.proc.poll() is None:
            stop_group(self.proc, term_first=False)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM the server, then SIGKILL what outlives it."""
        if self.proc is not None:
            stop_group(self.proc)
        self.proc = None

    def __enter__(self) -> MlflowServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
