"""Shared fixtures: every test starts and ends with tracing off."""

from __future__ import annotations

import os

import pytest

import tracer


@pytest.fixture(autouse=True)
def _reset_tracer(monkeypatch: pytest.MonkeyPatch) -> object:
    """Tracing off before and after each test; the tracer's own errors raise in tests."""
    monkeypatch.setenv(tracer.ENV_STRICT, "1")
    monkeypatch.delenv(tracer.ENV_TRACE_DIR, raising=False)
    monkeypatch.delenv(tracer.ENV_BACKEND, raising=False)
    tracer.shutdown()
    yield
    tracer.shutdown()


@pytest.fixture()
def trace_dir(tmp_path: os.PathLike[str]) -> str:
    """A fresh output directory."""
    return os.path.join(os.fspath(tmp_path), "traces")
