"""``rollout-trace demo``: run GRPO-style rollout steps and record them.

Registered with ``rollout-trace`` through the entry point
``demo = "rollout.cli:register_demo"``; ``python -m rollout`` runs the same.
With no flags it runs the scripted policy (no model) for a few steps and
writes local Arrow trace files under ``./rollout_traces``.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from tracer.cli.errors import error_text
from tracer.extras import install_command

DEFAULT_PROJECT = "rollout-demo"
#: The engines ``--engine`` accepts.
ENGINES = ("scripted", "hf", "openai", "vllm")

#: Shown at the end of ``rollout-trace demo --help``.
DEMO_EXAMPLES = """examples:
  rollout-trace demo                                   # scripted policy, no model: 4 steps, recorded to ./rollout_traces
  rollout-trace demo --steps 2 --batch 2 --n 2 --quiet
  rollout-trace demo --engine hf --model ./qwen2.5-coder-0.5b-instruct --few-shot   # python -m rollout.models writes the folder
  rollout-trace demo --engine openai --base-url http://127.0.0.1:8000/v1 --model my-model
"""


def choice_of(choices: Sequence[str], what: str) -> Callable[[str], str]:
    """An argparse ``type`` accepting one of ``choices``; a near miss is answered with "did you mean"."""

    def parse(text: str) -> str:
        if text in choices:
            return text
        close = difflib.get_close_matches(text, list(choices), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise argparse.ArgumentTypeError(f"unknown {what} {text!r}{hint}; choose from {', '.join(choices)}")

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's flags to ``parser``."""
    run = parser.add_argument_group("run")
    run.add_argument("--steps", type=int, default=4, help="training steps (default 4)")
    run.add_argument("--batch", type=int, default=4, help="problems per step (default 4)")
    run.add_argument("--n", type=int, default=4, help="rollouts per problem, the GRPO group size (default 4)")
    run.add_argument(
        "--val-every",
        type=int,
        default=2,
        metavar="K",
        help="validation pass (greedy, validate=True) every K steps; 0: never (default 2)",
    )
    run.add_argument("--val-size", type=int, default=4, help="problems held out for validation (default 4)")
    run.add_argument("--temperature", type=float, default=1.0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--problems", metavar="JSONL", help="problems file (default: the ones shipped in rollout/data)")
    run.add_argument(
        "--few-shot",
        action="store_true",
        help="put one worked tool-calling example before each question (helps small models)",
    )
    run.add_argument(
        "--prefill",
        metavar="TEXT",
        help='text that starts the first assistant turn, e.g. \'<tool_call>\\n{"name": "\' to make a small model call a tool first (prompt tokens, not model tokens)',
    )
    budget = parser.add_argument_group("rollout budgets")
    budget.add_argument("--max-turns", type=int, default=4, help="model turns per rollout (default 4)")
    budget.add_argument("--max-new-tokens", type=int, default=256, help="tokens per model turn (default 256)")
    budget.add_argument(
        "--max-response-tokens", type=int, default=1024, help="tokens after the prompt per rollout (default 1024)"
    )
    eng = parser.add_argument_group("engine")
    eng.add_argument(
        "--engine",
        default="scripted",
        type=choice_of(ENGINES, "engine"),
        metavar="{" + ",".join(ENGINES) + "}",
        help="scripted (a scripted policy, no model; default), hf, openai or vllm",
    )
    eng.add_argument(
        "--model", metavar="PATH", help="model folder (hf, vllm), or the model name sent to an openai endpoint"
    )
    eng.add_argument("--gguf-file", metavar="NAME", help="hf: load this GGUF file inside --model")
    eng.add_argument("--base-url", metavar="URL", help="openai: the endpoint, e.g. http://127.0.0.1:8000/v1")
    eng.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer folder (default: the model's; scripted/openai: a Qwen tokenizer built locally)",
    )
    eng.add_argument(
        "--cache",
        metavar="DIR",
        help="where the built Qwen tokenizer is cached (default $ROLLOUT_TRACE_CACHE or ~/.cache/rollout-trace)",
    )
    eng.add_argument(
        "--max-batch-size", type=int, default=16, help="hf: most sequences generated together (default 16)"
    )
    eng.add_argument("--device", default="cpu", help="hf: where the model runs, e.g. cuda or cuda:1 (default cpu)")
    eng.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="hf: the weights' dtype (default: the checkpoint's)",
    )
    eng.add_argument(
        "--trainer-dtype",
        choices=("float32", "bfloat16", "float16"),
        help="hf: log each turn's trainer logprobs and entropies from a second forward pass of the same "
        "weights in this dtype (default: synthetic stats, labelled so)",
    )
    eng.add_argument(
        "--scripted-latency",
        type=float,
        default=0.0005,
        metavar="S",
        help="scripted: simulated seconds per generated token (default 0.0005)",
    )
    out = parser.add_argument_group("recording")
    out.add_argument(
        "--out", default="./rollout_traces", metavar="DIR", help="trace output directory (default ./rollout_traces)"
    )
    out.add_argument("--project", default=DEFAULT_PROJECT, help=f"project name (default {DEFAULT_PROJECT})")
    out.add_argument("--experiment", help="experiment name (default: ENGINE-YYYYmmdd-HHMMSS)")
    out.add_argument(
        "--no-trace",
        action="store_true",
        help="run without recording (backend=None), e.g. to measure the tracing overhead",
    )
    out.add_argument("--quiet", action="store_true", help="print only the summary")


def register_demo(subparsers: Any) -> None:
    """Entry point of ``rollout-trace demo`` (group ``rollout_trace.commands``)."""
    parser = subparsers.add_parser(
        "demo",
        help="run GRPO-style tool-calling rollouts (scripted policy by default) and record them",
        description=__doc__,
        epilog=DEMO_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_demo_arguments(parser)
    parser.set_defaults(func=run_demo)


def _unescape(text: str) -> str:
    """``\\n`` and ``\\t`` typed on a command line become a newline and a tab."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _cuda_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _check_args(args: argparse.Namespace) -> str | None:
    for key in ("steps", "batch", "n", "max_turns", "max_new_tokens", "max_response_tokens", "max_batch_size"):
        if getattr(args, key) < 1:
            return f"--{key.replace('_', '-')} must be at least 1 (got {getattr(args, key)})"
    if args.val_every < 0:
        return f"--val-every must be 0 (never) or a number of steps (got {args.val_every})"
    if args.engine in ("hf", "vllm") and not args.model:
        return f"--engine {args.engine} needs --model PATH (a local model folder)"
    if args.engine in ("hf", "vllm") and not os.path.exists(args.model):
        return f"--model {args.model!r} does not exist; give a local model folder (no model is downloaded)"
    if args.device != "cpu" and args.engine != "hf":
        return f"--device applies to --engine hf only (got --engine {args.engine})"
    if args.trainer_dtype and args.engine != "hf":
        return f"--trainer-dtype applies to --engine hf only (got --engine {args.engine})"
    if args.device.startswith("cuda") and not _cuda_visible():
        return f"--device {args.device}: torch sees no CUDA device here; use --device cpu, or a CUDA build of torch"
    if args.engine == "openai" and not args.base_url:
        return "--engine openai needs --base-url URL, e.g. http://127.0.0.1:8000/v1"
    return None


def build_engine(args: argparse.Namespace, problems: list[dict[str, Any]]) -> tuple[Any, Any]:
    """The engine and tokenizer the flags ask for."""
    from rollout.engines import create_engine
    from rollout.tokenizer import load_qwen_tokenizer

    def tokenizer_from(path: str | None, **kw: Any) -> Any:
        if path is None:
            return load_qwen_tokenizer(args.cache)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True, **kw)

    if args.engine == "scripted":
        tok = tokenizer_from(args.tokenizer)
        return create_engine(
            "scripted", tokenizer=tok, problems=problems, latency_per_token_s=args.scripted_latency
        ), tok
    if args.engine == "hf":
        extra = {"gguf_file": args.gguf_file} if args.gguf_file and not args.tokenizer else {}
        tok = tokenizer_from(args.tokenizer or args.model, **extra)
        engine = create_engine(
            "hf",
            model=args.model,
            tokenizer=tok,
            gguf_file=args.gguf_file,
            max_batch_size=args.max_batch_size,
            device=args.device,
            dtype=args.dtype,
        )
        return engine, tok
    if args.engine == "openai":
        tok_path = args.tokenizer or (args.model if args.model and os.path.isdir(args.model) else None)
        tok = tokenizer_from(tok_path)
        engine = create_engine("openai", base_url=args.base_url, model=args.model or "default", tokenizer=tok)
        return engine, tok
    tok = tokenizer_from(args.tokenizer or args.model)
    return create_engine("vllm", model=args.model, tokenizer=tok), tok


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo with parsed ``args``; return the exit status."""
    problem = _check_args(args)
    if problem:
        return _fail(problem)
    try:
        return asyncio.run(_run(args))
    except (ImportError, FileNotFoundError, ValueError, ConnectionError) as exc:
        return _fail(error_text(exc, "demo"))


#: Flags that say where and how the demo records, not what it trains: left out of the run config.
_NOT_RUN_CONFIG = frozenset({"out", "cache", "project", "experiment", "quiet", "no_trace", "func", "command"})


def demo_run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The demo's flags as the run config (what ``compare`` and ``diff`` set side by side)."""
    return {k: v for k, v in sorted(vars(args).items()) if k not in _NOT_RUN_CONFIG and not callable(v)}


async def _run(args: argparse.Namespace) -> int:
    import tracer
    from rollout.agent_loop import AgentLoopConfig, ToolAgentLoop
    from rollout.runner import RunConfig, load_problems, run_steps
    from rollout.tools import default_tools

    started = time.perf_counter()
    problems = load_problems(args.problems)
    engine, tokenizer = build_engine(args, problems)
    experiment = args.experiment or f"{args.engine}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = tracer.init(
        project_name=args.project,
        experiment_name=experiment,
        backend=None if args.no_trace else "arrow",
        output_dir=args.out,
        token2text=True,
        tokenizer=tokenizer,
        run_config=demo_run_config(args),
    )
    loop = ToolAgentLoop(
        engine,
        tokenizer,
        default_tools(),
        AgentLoopConfig(
            max_turns=args.max_turns,
            max_new_tokens=args.max_new_tokens,
            max_response_tokens=args.max_response_tokens,
            few_shot=args.few_shot,
            first_turn_prefix=_unescape(args.prefill) if args.prefill else None,
        ),
    )
    run_cfg = RunConfig(
        steps=args.steps,
        batch_size=args.batch,
        n=args.n,
        val_every=args.val_every,
        val_size=args.val_size,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    engine_label = (
        f"{args.engine} ({'scripted policy, no model' if args.engine == 'scripted' else args.model or args.base_url})"
    )
    if not args.quiet:
        print(f"engine: {engine_label}; {args.steps} steps x {args.batch} problems x {args.n} rollouts")
    trainer = None
    if args.trainer_dtype:
        from rollout.trainer_stats import ForwardPass

        trainer = ForwardPass(args.model, args.trainer_dtype, rollout_dtype=args.dtype, device=args.device)
    try:
        results = await run_steps(
            loop,
            problems,
            run_cfg,
            on_step=None if args.quiet else lambda r: print(r.describe(), flush=True),
            trainer=trainer,
        )
    finally:
        await engine.close()
        flushed = tracer.shutdown()
    elapsed = time.perf_counter() - started
    failed = [e for r in results for e in r.errors]
    n_train = sum(len(r.rollouts) for r in results if not r.validate)
    n_val = sum(len(r.rollouts) for r in results if r.validate)
    print(f"ran {n_train} training and {n_val} validation rollouts in {elapsed:.1f} s")
    if failed:
        print(f"warning: {len(failed)} rollouts failed; first: {failed[0]}", file=sys.stderr)
    if args.no_trace:
        print("tracing was off (--no-trace): nothing recorded")
        return 1 if failed else 0
    if not flushed.ok:
        print(f"warning: not everything was written: {flushed.message}", file=sys.stderr)
    run_dir = cfg.run_dir
    print(f"recorded to {run_dir}")
    for line in next_steps(run_dir):
        print(line)
    return 1 if failed else 0


def next_steps(run_dir: str) -> list[str]:
    """The commands the demo prints to look at ``run_dir``; a step whose package is missing says how to add it.

    ``view`` needs no ``--tokenizer``: the run's config records the tokenizer's
    folder, where the viewer finds it.
    """
    steps = [
        ("view:   ", f"rollout-trace view {run_dir}", "streamlit", "viewer", "   # a web app on http://127.0.0.1:8501"),
        (
            "export: ",
            f"rollout-trace export {run_dir} --to mlflow",
            "mlflow",
            "mlflow",
            "   # into ./mlflow.db; then: mlflow ui",
        ),
        ("summary:", f"rollout-trace info {run_dir}", None, None, ""),
    ]
    lines = []
    for label, command, module, extra, note in steps:
        if module is not None and extra is not None and importlib.util.find_spec(module) is None:
            note = f"   # first: {install_command(extra)}"
        lines.append(f"  {label} {command}{note}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rollout``: the demo's flags, without the ``demo`` word."""
    parser = argparse.ArgumentParser(
        prog="python -m rollout",
        description=__doc__,
        epilog=DEMO_EXAMPLES.replace("rollout-trace demo", "python -m rollout"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_demo_arguments(parser)
    return run_demo(parser.parse_args(argv))
