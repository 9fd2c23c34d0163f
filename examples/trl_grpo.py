"""Record TRL's GRPOTrainer with rollout-trace: ``python examples/trl_grpo.py --output-dir DIR``.

Trains 2 steps of GRPO on CPU, offline, with a tiny random Qwen3 model (built
here unless ``--model`` names one: ``python -m rollout.models tiny-qwen3 --out
DIR`` writes the same), an in-memory dataset and a reward that varies. The
one line that records it is ``record_grpo(trainer, ...)``; then::

    rollout-trace view DIR/traces/trl_grpo/run-1
"""

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from tracer.integrations.trl import record_grpo  # noqa: E402


def brevity(completions, **kwargs):
    """Shorter answers score higher: 1 for an empty answer, 0 from 100 characters on."""
    return [max(0.0, 1.0 - len(c[0]["content"]) / 100) for c in completions]


def mentions_answer(completions, answer, **kwargs):
    """1 when the completion contains the expected number."""
    return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, help="where TRL's outputs and the traces go")
    parser.add_argument("--model", help="a model folder (default: a tiny random Qwen3 built under --output-dir)")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)

    model_dir = args.model
    if model_dir is None:
        from rollout.models import make_tiny_qwen3

        model_dir = str(make_tiny_qwen3(os.path.join(args.output_dir, "model")))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {a} + {a}?"}], "answer": str(2 * a)} for a in range(8)]
    )
    config = GRPOConfig(
        output_dir=os.path.join(args.output_dir, "trl"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=args.steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        run_name="run-1",
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[brevity, mentions_answer],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    traces = os.path.join(args.output_dir, "traces")
    record_grpo(trainer, output_dir=traces, project_name="trl_grpo")  # the one line
    trainer.train()
    print(
        f"recorded {args.steps} steps; view them with: rollout-trace view {os.path.join(traces, 'trl_grpo', 'run-1')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
