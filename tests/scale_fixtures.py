"""Helpers for the scale-out tests: subprocess scripts, optional packages, a local S3 server."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from server_fixtures import free_port, start_group, stop_group, wait_answering

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


class MotoServer:
    """``moto_server`` (a local S3-compatible server) on 127.0.0.1, as a subprocess."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkdtemp(prefix="rt-moto-")) / "server.log"
        # This interpreter's moto, not whatever `moto_server` is first on PATH.
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.proc = start_group(cmd, self.log)
        try:
            wait_answering(self.proc, self.endpoint + "/moto-api/", 120, self.log)
        except BaseException:
            stop_group(self.proc)  # its log is kept: the error names it
            raise

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
        """Stop the server and remove its log."""
        stop_group(self.proc)
        shutil.rmtree(self.log.parent, ignore_errors=True)
