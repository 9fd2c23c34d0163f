"""Fixtures of the viewer's tests: two runs that differ (see tests/compare_fixtures.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from compare_fixtures import CONFIG_A, CONFIG_B, PROJECT, record_compare_run

import tracer


@pytest.fixture(scope="module")
def compare_runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(root, run A, run B): B regresses on sample 1 (reward 0 where A has 1) and improves on sample 2."""
    root = os.fspath(tmp_path_factory.mktemp("compare_runs"))
    run_a = record_compare_run(root, "a", CONFIG_A, lambda s, p, n: 1.0 if p == 1 else 0.0)
    run_b = record_compare_run(root, "b", CONFIG_B, lambda s, p, n: 1.0 if p == 2 else 0.0)
    yield os.path.join(root, PROJECT), run_a, run_b
    tracer.shutdown()


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A demo run (scripted engine, few-shot prompts): 3 steps x 3 problems x 4 rollouts; its run directory."""
    import contextlib
    import io

    from rollout.cli import main as demo_main

    out = tmp_path_factory.mktemp("demo")
    argv = [
        "--steps", "3", "--batch", "3", "--n", "4", "--val-every", "0", "--few-shot", "--seed", "1",
        "--scripted-latency", "0", "--out", os.fspath(out), "--experiment", "fs", "--cache", os.fspath(out / "cache"),
        "--quiet",
    ]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert demo_main(argv) == 0
    return os.fspath(out / "rollout-demo" / "fs")
