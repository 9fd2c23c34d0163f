"""Where vllm does not import, its tests skip, unless ``ROLLOUT_TRACE_REQUIRE_VLLM=1`` makes that an error (as in CI)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

VLLM_TESTS = Path(__file__).with_name("test_rollout_vllm.py")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm imports here")


def _pytest(require: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_TRACE_REQUIRE_VLLM"}
    if require is not None:
        env["ROLLOUT_TRACE_REQUIRE_VLLM"] = require
    cmd = [sys.executable, "-m", "pytest", str(VLLM_TESTS), "-q", "-rs", "-p", "no:cacheprovider"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_vllm_tests_skip_where_vllm_is_missing() -> None:
    """Without the variable the module skips, naming the reason."""
    done = _pytest(None)
    assert done.returncode in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED), done.stdout + done.stderr
    assert "1 skipped" in done.stdout and "vllm does not import here" in done.stdout


def test_require_vllm_turns_the_skip_into_an_error() -> None:
    """With ROLLOUT_TRACE_REQUIRE_VLLM=1 the same run fails and says why."""
    done = _pytest("1")
    assert done.returncode == pytest.ExitCode.INTERRUPTED  # a collection error
    assert "ROLLOUT_TRACE_REQUIRE_VLLM=1 but vllm does not import" in done.stdout + done.stderr
