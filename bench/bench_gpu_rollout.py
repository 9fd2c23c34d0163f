"""Tracing overhead of the reference rollout on a GPU: traced against untraced, taking turns.

The agent loop (``rollout/``) runs with the transformers engine on CUDA and a
real-sized model built with random weights (no download): Qwen2.5-0.5B's
shape by default. Each round runs the same steps twice, once untraced
(``backend=None``) and once recorded with token2text on (as verl users
record), in alternating order; the traced time includes ``tracer.shutdown()``
(everything durable on disk). It prints the median wall time of each and
their ratio, and writes the figures to ``--out`` (JSON, the bench/results
format) as it goes, so a run cut short still leaves its rounds.

    python bench/bench_gpu_rollout.py --device cuda --out bench/results/bench_gpu_rollout.json

``--size tiny`` (a 2-layer model) runs the same code on a CPU in seconds; a
test does that so the bench cannot rot.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tracer  # noqa: E402
from rollout.agent_loop import AgentLoopConfig, ToolAgentLoop  # noqa: E402
from rollout.engines.hf import HFEngine  # noqa: E402
from rollout.runner import RunConfig, load_problems, run_steps  # noqa: E402
from rollout.tokenizer import QWEN_MODEL_VOCAB_SIZE, load_qwen_tokenizer  # noqa: E402
from rollout.tools import default_tools  # noqa: E402

#: Model shapes: Qwen2.5-0.5B's, and a tiny one for CPU checks.
SIZES: dict[str, dict[str, int]] = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
}


def build_model(size: str, tok: Any, device: str, dtype: str) -> Any:
    """A Qwen2 causal LM of the given shape with random weights, on ``device``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=QWEN_MODEL_VOCAB_SIZE,
        max_position_embeddings=4096,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
        **SIZES[size],
    )
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(getattr(torch, dtype))


def one_run(traced: bool, engine: HFEngine, tok: Any, args: argparse.Namespace, out: str, tag: str) -> float:
    """Wall seconds for ``args.steps`` steps, the final flush included when traced."""
    loop = ToolAgentLoop(
        engine,
        tok,
        default_tools(),
        AgentLoopConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens),
    )
    cfg = RunConfig(steps=args.steps, batch_size=args.batch, n=args.n, val_every=0)
    if traced:
        tracer.init(
            project_name="gpu", experiment_name=tag, backend="arrow", output_dir=out, token2text=True, tokenizer=tok
        )
    start = time.perf_counter()
    asyncio.run(run_steps(loop, load_problems(), cfg))
    if traced:
        tracer.shutdown()
    return time.perf_counter() - start


def write(path: str | None, times: dict[str, list[float]], args: argparse.Namespace) -> dict[str, Any]:
    off, on = (statistics.median(times[k]) if times[k] else float("nan") for k in ("untraced", "traced"))
    ratio = on / off
    result = {
        "bench": "bench_gpu_rollout",
        "what": f"reference rollout, hf engine on {args.device}, {args.size} random weights ({args.dtype}), "
        f"{args.batch * args.n} trajectories a step, {args.steps} steps, <= {args.max_turns} turns of "
        f"{args.max_new_tokens} tokens: traced (token2text) / untraced",
        "command": "python bench/bench_gpu_rollout.py " + " ".join(sys.argv[1:]),
        "figure": f"{ratio:.3f}x (median {on:.2f} s traced vs {off:.2f} s untraced, "
        f"{min(len(times['traced']), len(times['untraced']))} rounds)",
        "target": "<= 1.02x",
        "met": bool(ratio <= 1.02),
        "measured": datetime.date.today().isoformat(),
        "rounds": times,
    }
    if path:
        Path(path).write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--size", choices=sorted(SIZES), default="qwen2.5-0.5b")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16, help="problems a step")
    parser.add_argument("--n", type=int, default=8, help="rollouts a problem")
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--cache", help="where the Qwen tokenizer is built (default: rollout's cache)")
    parser.add_argument("--out", help="write the figures here (JSON) after every round")
    args = parser.parse_args(argv)
    tok = load_qwen_tokenizer(args.cache)
    model = build_model(args.size, tok, args.device, args.dtype)
    engine = HFEngine(model, tok, device=args.device, max_batch_size=args.batch * args.n)
    times: dict[str, list[float]] = {"untraced": [], "traced": []}
    with tempfile.TemporaryDirectory() as out:
        one_run(False, engine, tok, args, out, "warmup")
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for traced in order:
                t = one_run(traced, engine, tok, args, out, f"r{r}")
                times["traced" if traced else "untraced"].append(t)
                print(f"round {r}: {'traced' if traced else 'untraced'} {t:.2f} s", flush=True)
            result = write(args.out, times, args)
    print(result["figure"], flush=True)
    return result


if __name__ == "__main__":
    main()
