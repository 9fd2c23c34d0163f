"""The GPU rollout bench and `demo --device`, run on this machine's CPU so they cannot rot."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tracer.cli import main as rollout_trace_main

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_gpu_rollout.py"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_gpu_rollout", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu_rollout"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_bench_runs_both_ways_and_writes_its_figures(tmp_path: Path, tokenizer_cache: str) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "gpu.json"
    argv = ["--device", "cpu", "--dtype", "float32", "--size", "tiny", "--rounds", "2", "--steps", "1"]
    argv += ["--batch", "2", "--n", "2", "--max-new-tokens", "8", "--cache", tokenizer_cache, "--out", str(out)]
    result = _bench().main(argv)
    written = json.loads(out.read_text())
    assert written["figure"] == result["figure"]
    assert len(written["rounds"]["traced"]) == len(written["rounds"]["untraced"]) == 2
    assert all(t > 0 for ts in written["rounds"].values() for t in ts)
    assert written["target"] == "<= 1.02x" and isinstance(written["met"], bool)


def test_demo_refuses_a_cuda_device_torch_cannot_see(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    rc = rollout_trace_main(["demo", "--engine", "hf", "--model", str(tmp_path), "--device", "cuda"])
    assert rc == 2
    assert "--device cuda: torch sees no CUDA device here" in capsys.readouterr().err


def test_demo_refuses_a_device_for_engines_without_one(capsys: pytest.CaptureFixture[str]) -> None:
    rc = rollout_trace_main(["demo", "--device", "cuda"])
    assert rc == 2
    assert "--device applies to --engine hf only" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_runs_the_hf_engine_on_the_device_and_dtype_asked(
    tmp_path: Path, tiny_qwen3_dir: Path, tokenizer_cache: str
) -> None:
    argv = ["demo", "--engine", "hf", "--model", str(tiny_qwen3_dir), "--device", "cpu", "--dtype", "bfloat16"]
    argv += ["--steps", "1", "--batch", "1", "--n", "2", "--max-new-tokens", "8", "--max-turns", "1"]
    argv += ["--out", str(tmp_path), "--experiment", "e", "--cache", tokenizer_cache, "--quiet"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert rollout_trace_main(argv) == 0
    import tracer

    rows = tracer.read_trajectories(str(tmp_path / "rollout-demo" / "e"))
    assert rows.num_rows == 2
