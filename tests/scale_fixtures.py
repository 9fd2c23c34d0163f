"""Helpers for the scale-out tests: subprocess scripts, optional packages, a local S3 server."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def need(module: str, install: str) -> None:
    """Skip the test unless ``module`` is importable; say what to install."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"needs {module}: pip install {install}")


def run_script(
    code: str, env: dict[str, str] | None = None, timeout: float = 300.0, expect_killed: bool = False
) -> str:
    """Run ``code`` in a fresh interpreter from the repository root; return its stdout or fail with stderr.

    With ``expect_killed``, the script must end by SIGKILL (a simulated crash).
    """
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, full_env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if expect_killed:
        if proc.returncode != -9:
            raise AssertionError(
                f"script was not killed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
            )
        return proc.stdout
    if proc.returncode != 0:
        raise AssertionError(f"script failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc.stdout


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """``moto_server`` (a local S3-compatible server) on 127.0.0.1, as a subprocess."""

    def __init__(self) -> None:
        import time
        import urllib.request

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            # This interpreter's moto, not whatever `moto_server` is first on PATH.
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=5).read()  # noqa: S310 - local server
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not start on {self.endpoint}") from None
                time.sleep(0.2)

    def env(self) -> dict[str, str]:
        """Environment variables that point pyarrow's S3 client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def create_bucket(self, name: str) -> None:
        """Create an S3 bucket."""
        import pyarrow.fs as pafs

        pafs.S3FileSystem(
            endpoint_override=self.endpoint,
            access_key="testing",
            secret_key="testing",
            region="us-east-1",
            allow_bucket_creation=True,
        ).create_dir(name)

    def stop(self) -> None:
        """Stop the server."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
