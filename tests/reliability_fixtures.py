"""Helpers for the reliability tests: figures printed at the end, subprocess writers, small disks.

The fault tests add their figures (faults injected, spans acknowledged, spans
recovered, inputs tried) to :data:`FIGURES` (modules that use the ``figures_report`` fixture);
they are printed in pytest's terminal summary and saved in pytest's cache
(``.pytest_cache/v/rollout_trace/reliability_figures``) for RELIABILITY.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import tracer

TESTS = os.path.dirname(os.path.abspath(__file__))
FAULTS = os.path.join(TESTS, "faults")
REPO = os.path.dirname(TESTS)
CACHE_KEY = "rollout_trace/reliability_figures"

#: Figures of this session, by test: {"kill -9": {"kills": 24, ...}, ...}.
FIGURES: dict[str, dict[str, Any]] = {}


class FiguresReport:
    """A pytest plugin that prints :data:`FIGURES` at the end and stores them in the cache."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not FIGURES:
            return
        terminalreporter.section("reliability figures")
        for name, values in FIGURES.items():
            terminalreporter.write_line(f"{name}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
        cache = getattr(self.config, "cache", None)  # absent under -p no:cacheprovider
        if cache is not None:
            old = cache.get(CACHE_KEY, {})
            old.update(FIGURES)
            cache.set(CACHE_KEY, old)


def python_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess that imports this checkout's packages."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, TESTS, env.get("PYTHONPATH", "")) if p)
    env.pop(tracer.ENV_TRACE_DIR, None)
    env.pop(tracer.ENV_BACKEND, None)
    env.update(extra)
    return env


def start_fault_script(name: str, *args: object, **env: str) -> subprocess.Popen[str]:
    """Start ``tests/faults/{name}`` with ``args``; stdout is a pipe of text lines."""
    return subprocess.Popen(
        [sys.executable, os.path.join(FAULTS, name), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(**env),
    )


def read_quietly(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Call a reader; return its result and the TraceFileWarning messages it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    messages = [str(w.message) for w in caught if issubclass(w.category, tracer.TraceFileWarning)]
    return result, messages


@contextlib.contextmanager
def small_disk(size: str = "2m") -> Iterator[str]:
    """A tmpfs of ``size`` mounted on a fresh directory (needs root); skip the test if mount fails."""
    path = tempfile.mkdtemp(prefix="rt-small-disk-")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True)
    if proc.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"cannot mount a tmpfs (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir(path)


def fill_disk(directory: str, name: str = "filler") -> str:
    """Write zeros into ``directory/name`` until the disk is full; return the file's path."""
    path = os.path.join(directory, name)
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        small = b"\0" * 512
        try:
            while True:
                f.write(small)
        except OSError:
            pass
    return path


def dump_json(value: Any) -> str:
    """Compact JSON for figures and messages."""
    return json.dumps(value, sort_keys=True, default=str)
