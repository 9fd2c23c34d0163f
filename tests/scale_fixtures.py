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


def run_script(code: str, env: dict[str, str] | None = None, timeout: float = 300.0) -> str:
    """Run ``code`` in a fresh interpreter from the repository root; return its stdout or fail with stderr."""
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
    if proc.returncode != 0:
        raise AssertionError(f"script failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc.stdout
