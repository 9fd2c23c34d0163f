"""What recording a TRL GRPOTrainer costs: the same training with and without ``record_grpo``, in one process.

Each round trains ``--steps`` GRPO steps of a tiny random Qwen3 model on CPU
(8 completions a step, 8 new tokens) twice, unrecorded and recorded, in
alternating order; the figure is the ratio of the medians of ``trainer.train()``
wall time. The tiny model makes generation cheap, so the ratio is an upper
bound of the recording's share for real models.

    python bench/bench_trl.py [--rounds 3] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

RESULTS = Path(__file__).resolve().parent / "results" / "trl.json"


def _train(model_dir: str, out: str, steps: int, record: bool) -> float:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import tracer
    from tracer.integrations.trl import record_grpo

    def brevity(completions: list, **kwargs: object) -> list[float]:
        return [max(0.0, 1.0 - len(c[0]["content"]) / 100) for c in completions]

    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {a}?"}]} for a in range(8)]
    config = GRPOConfig(
        output_dir=os.path.join(out, "trl"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=steps,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[brevity],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    if record:
        record_grpo(trainer, output_dir=os.path.join(out, "traces"))
    start = time.perf_counter()
    trainer.train()
    if record:
        tracer.flush()  # recorded means durable: the flush is part of the cost
    elapsed = time.perf_counter() - start
    if record:
        tracer.shutdown()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    from rollout.models import make_tiny_qwen3

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_tiny_qwen3(os.path.join(tmp, "model")))
        times: dict[bool, list[float]] = {False: [], True: []}
        _train(model_dir, os.path.join(tmp, "warmup"), 1, False)
        for r in range(args.rounds):
            for record in (r % 2 == 1, r % 2 == 0):
                times[record].append(_train(model_dir, os.path.join(tmp, f"{r}-{record}"), args.steps, record))
    plain, recorded = statistics.median(times[False]), statistics.median(times[True])
    load = os.getloadavg()[0]
    figure = (
        f"{recorded / plain:.2f}x unrecorded ({recorded:.2f} vs {plain:.2f} s for {args.steps} steps, "
        f"median of {args.rounds}; load {load:.1f} on {os.cpu_count()} cores)"
    )
    print(figure)
    result = {
        "bench": "trl",
        "what": "GRPOTrainer.train() with record_grpo against without, tiny Qwen3 on CPU, 8 completions a step",
        "command": "python bench/bench_trl.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "figure": figure,
        "target": "recording adds little to a step",
        "met": None,
        "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
