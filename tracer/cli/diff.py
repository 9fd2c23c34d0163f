"""``rollout-trace diff RUN_A RUN_B``: per prompt, how run B's rewards differ from run A's
(:func:`tracer.compare_runs`); ``--json`` prints ``config`` differences and ``prompts`` rows."""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from typing import Any

from tracer import compare as C  # noqa: N812 - short, as the schema module
from tracer import schema as S  # noqa: N812 - the schema module, short as elsewhere
from tracer.cli.errors import no_trace_files
from tracer.cli.terminal import terminal_text
from tracer.compare import DEFAULT_PASS_THRESHOLD, compare_runs, default_steps, diff_configs, read_run_config
from tracer.read import TraceFileWarning, list_trace_files, read_steps

#: Rows the text output prints unless --limit says otherwise.
DEFAULT_LIMIT = 20
#: Characters of a question the text output shows.
PROMPT_CHARS = 60

DIFF_EXAMPLES = """examples:
  rollout-trace diff rollout_traces/gsm8k/grpo-1 rollout_traces/gsm8k/grpo-2   # the last step both runs have
  rollout-trace diff RUN_A RUN_B --all-steps                 # every step of each run, pooled per prompt
  rollout-trace diff RUN RUN --steps-a 10 --steps-b 200      # two steps of one run
  rollout-trace diff RUN_A RUN_B --json > diff.json
"""


def _steps(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give steps as integers separated by commas, e.g. 10,20") from None


def register_diff(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diff",
        help="compare two runs (or two steps of one run) prompt by prompt",
        description="Per prompt: rollouts, reward mean and pass rate of A and B, and B - A; the biggest regression first.",
        epilog=DIFF_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_a", help="run A: a trace file or directory")
    p.add_argument("run_b", help="run B (the same path again with --steps-a/--steps-b compares two steps)")
    p.add_argument("--steps-a", type=_steps, help="steps of A, comma-separated (default: the last step both runs have)")
    p.add_argument("--steps-b", type=_steps, help="steps of B, comma-separated (default: the last step both runs have)")
    p.add_argument("--all-steps", action="store_true", help="pool every step of each run per prompt")
    p.add_argument("--split", choices=("both", "train", "validation"), default="both", help="rollouts to compare")
    p.add_argument(
        "--pass-threshold",
        type=float,
        default=DEFAULT_PASS_THRESHOLD,
        help=f"a rollout passes at reward >= this (default {DEFAULT_PASS_THRESHOLD})",
    )
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"prompts to print (default {DEFAULT_LIMIT})")
    p.add_argument("--json", action="store_true", help="print every prompt and the config differences as JSON")
    p.set_defaults(func=run_diff, run_paths=("run_a", "run_b"))


def _num(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else x


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def run_diff(args: argparse.Namespace) -> int:
    """Print the comparison of ``args.run_a`` and ``args.run_b``."""
    for path in (args.run_a, args.run_b):
        if not list_trace_files(path):
            return no_trace_files(path, "a run directory")
    validate = {"both": None, "train": False, "validation": True}[args.split]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceFileWarning)
        steps_a, steps_b, how = args.steps_a, args.steps_b, "the steps given"
        if args.all_steps:
            steps_a, steps_b, how = None, None, "every step of each run, pooled per prompt"
        elif steps_a is None and steps_b is None:
            a, b, how = default_steps(read_steps(args.run_a)[0], read_steps(args.run_b)[0])
            steps_a, steps_b = (None if a is None else [a]), (None if b is None else [b])
        table = compare_runs(
            args.run_a,
            args.run_b,
            steps_a=steps_a,
            steps_b=steps_b,
            validate=validate,
            pass_threshold=args.pass_threshold,
        )
        config = diff_configs(read_run_config(args.run_a), read_run_config(args.run_b))
    rows = table.to_pylist()
    if args.json:
        out = {
            "run_a": args.run_a,
            "run_b": args.run_b,
            "steps_a": steps_a,
            "steps_b": steps_b,
            "steps": how,
            "config": [{"key": k, "a": a, "b": b} for k, a, b in config],
            "prompts": [{k: _num(v) for k, v in r.items()} for r in rows],
        }
        print(json.dumps(out, ensure_ascii=False, default=str))
    else:
        print(f"A: {args.run_a}" + (f" steps {steps_a}" if steps_a else " (all steps)"))
        print(f"B: {args.run_b}" + (f" steps {steps_b}" if steps_b else " (all steps)"))
        print(f"compared at: {how}")
        if config:
            print("config differences:")
            for key, a, b in config:
                print(f"  {key}: {a!r} -> {b!r}")
        print(f"{len(rows)} prompt(s); biggest regression first")
        print(
            f"{'sample':>10} {'step_a':>7} {'step_b':>7} {'n_a':>4} {'n_b':>4} {'reward_a':>9} {'reward_b':>9} "
            f"{'delta':>8} {'pass_a':>7} {'pass_b':>7}  question"
        )
        for r in rows[: max(0, args.limit)]:
            prompt = terminal_text(" ".join(str(r[C.QUESTION] or r[C.PROMPT] or "").split())[:PROMPT_CHARS])
            print(
                f"{terminal_text(r[S.SAMPLE_INDEX]):>10} {r[C.STEPS_A] or '-':>7} {r[C.STEPS_B] or '-':>7} "
                f"{r[C.ROLLOUTS_A]:>4} {r[C.ROLLOUTS_B]:>4} {_fmt(r[C.REWARD_A]):>9} "
                f"{_fmt(r[C.REWARD_B]):>9} {_fmt(r[C.DELTA], '+.3f'):>8} {_fmt(r[C.PASS_RATE_A], '.0%'):>7} "
                f"{_fmt(r[C.PASS_RATE_B], '.0%'):>7}  {prompt}"
            )
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return 0
