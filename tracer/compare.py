"""Comparing two runs, or two steps of one run, prompt by prompt (:func:`compare_runs`), and their recorded
training settings (:func:`read_run_config`, :func:`diff_configs`). A prompt is ``(validate, sample_index)``: the
same index names the same prompt when both runs read the same data in the same order, as verl does."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S  # noqa: N812 - the schema module, short as elsewhere
from tracer.index.readers import read_trajectories
from tracer.questions import questions_and_answers
from tracer.read import TracePaths, list_trace_files, read_file_metadata, read_spans
from tracer.summary import TURN_SPAN_COLUMNS, prompt_and_response, trajectory_turns

#: Columns of :func:`compare_runs`' table (besides ``sample_index`` and ``validate``).
PROMPT = "prompt"
#: The prompt's question (:func:`tracer.questions.question_of`): what the tables name a prompt by.
QUESTION = "question"
#: The steps each side's rollouts of the prompt come from (``"4"``, or ``"1-4"`` over several steps).
STEPS_A = "steps_a"
STEPS_B = "steps_b"
ROLLOUTS_A = "rollouts_a"
ROLLOUTS_B = "rollouts_b"
REWARD_A = "reward_a"
REWARD_B = "reward_b"
DELTA = "delta"
PASS_RATE_A = "pass_rate_a"
PASS_RATE_B = "pass_rate_b"
PASS_RATE_DELTA = "pass_rate_delta"
TRACE_ID_A = "trace_id_a"
TRACE_ID_B = "trace_id_b"

#: A rollout passes when its reward is at least this (a full score on 0/1 rewards).
DEFAULT_PASS_THRESHOLD = 1.0
#: Key of the training config inside the recorded tracer config.
RUN_CONFIG_KEY = "run_config"

COMPARE_SCHEMA = pa.schema(
    [(S.VALIDATE, pa.bool_())]
    + [(c, pa.string()) for c in (S.SAMPLE_INDEX, QUESTION, STEPS_A, STEPS_B, PROMPT)]
    + [(c, pa.int64()) for c in (ROLLOUTS_A, ROLLOUTS_B)]
    + [(c, pa.float64()) for c in (REWARD_A, REWARD_B, DELTA, PASS_RATE_A, PASS_RATE_B, PASS_RATE_DELTA)]
    + [(c, pa.string()) for c in (TRACE_ID_A, TRACE_ID_B)]
)


#: One side's columns of :data:`COMPARE_SCHEMA`: steps, rollouts, reward mean, pass rate, first trace id.
_SIDE_A = (STEPS_A, ROLLOUTS_A, REWARD_A, PASS_RATE_A, TRACE_ID_A)
_SIDE_B = (STEPS_B, ROLLOUTS_B, REWARD_B, PASS_RATE_B, TRACE_ID_B)


def _per_prompt(trajectories: pa.Table, pass_threshold: float, side: Sequence[str]) -> dict[Any, dict[str, Any]]:
    """Per (validate, sample_index): one ``side``'s columns (:data:`_SIDE_A` or :data:`_SIDE_B`)."""
    t = trajectories.filter(pc.is_valid(trajectories.column(S.SAMPLE_INDEX)))
    reward = t.column(S.REWARD)
    work = pa.table(
        {
            "v": pc.fill_null(t.column(S.VALIDATE), False),
            "s": t.column(S.SAMPLE_INDEX),
            "r": reward,
            "p": pc.cast(pc.greater_equal(reward, pass_threshold), pa.float64()),
            "id": t.column(S.TRACE_ID),
            "step": t.column(S.STEP),
        }
    )
    g = work.group_by(["v", "s"], use_threads=False).aggregate(
        [("id", "count"), ("r", "mean"), ("p", "mean"), ("id", "min"), ("step", "min"), ("step", "max")]
    )
    out = {}
    for r in g.to_pylist():
        lo, hi = r["step_min"], r["step_max"]
        steps = None if lo is None else str(lo) if lo == hi else f"{lo}-{hi}"
        out[(bool(r["v"]), r["s"])] = dict(zip(side, (steps, r["id_count"], r["r_mean"], r["p_mean"], r["id_min"])))
    return out


def _prompts(path: str | os.PathLike[str], trace_ids: list[str]) -> dict[str, tuple[str, str | None]]:
    """Each trajectory's prompt as text (:func:`tracer.summary.prompt_and_response`) and its question."""
    if not trace_ids:
        return {}
    spans = read_spans(path, columns=TURN_SPAN_COLUMNS, trace_ids=trace_ids)
    questions = questions_and_answers(spans)
    return {
        tid: (prompt_and_response(turns)[0], questions.get(tid, (None, None))[0])
        for tid, turns in trajectory_turns(spans).items()
    }


def default_steps(steps_a: Sequence[int], steps_b: Sequence[int]) -> tuple[int | None, int | None, str]:
    """The steps two runs are compared at by default, and why: the last step both have, else each run's last."""
    common = sorted(set(steps_a) & set(steps_b))
    if common:
        return common[-1], common[-1], f"step {common[-1]} of both runs (the last step both have)"
    a, b = (max(steps_a) if steps_a else None), (max(steps_b) if steps_b else None)
    return a, b, f"each run's last step (A: step {a}, B: step {b}; no step in common)"


def _minus(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None else b - a


def compare_runs(
    run_a: str | os.PathLike[str],
    run_b: str | os.PathLike[str],
    steps_a: int | Iterable[int] | None = None,
    steps_b: int | Iterable[int] | None = None,
    validate: bool | None = None,
    pass_threshold: float = DEFAULT_PASS_THRESHOLD,
    prompts: bool = True,
) -> pa.Table:
    """Per prompt, the rollouts of run A against run B (:data:`COMPARE_SCHEMA`), by ``delta`` ascending (the
    biggest regression first, nulls last), then prompt; two steps of one run: ``compare_runs(run, run, 10, 200)``.
    ``steps_a``/``steps_b``: each side's steps (default all); ``validate``: only validation (True) or training
    (False) rollouts; a rollout passes at ``pass_threshold``; ``prompts`` adds each prompt's text (one trajectory
    read per prompt). ``reward_a/b``: mean reward (null without one); ``delta``: ``reward_b - reward_a``.
    """
    a = _per_prompt(read_trajectories(run_a, steps=steps_a, validate=validate), pass_threshold, _SIDE_A)
    b = _per_prompt(read_trajectories(run_b, steps=steps_b, validate=validate), pass_threshold, _SIDE_B)
    keys = sorted(set(a) | set(b), key=lambda k: (k[0], len(k[1]), k[1]))
    text_a = _prompts(run_a, [a[k][TRACE_ID_A] for k in keys if k in a]) if prompts else {}
    text_b = _prompts(run_b, [b[k][TRACE_ID_B] for k in keys if k not in a]) if prompts else {}
    rows = []
    for k in keys:
        row = {S.VALIDATE: k[0], S.SAMPLE_INDEX: k[1], ROLLOUTS_A: 0, ROLLOUTS_B: 0, **a.get(k, {}), **b.get(k, {})}
        found = text_a.get(row.get(TRACE_ID_A, "")) or text_b.get(row.get(TRACE_ID_B, ""))
        row[PROMPT], row[QUESTION] = found or (None, None)
        row[DELTA] = _minus(row.get(REWARD_B), row.get(REWARD_A))
        row[PASS_RATE_DELTA] = _minus(row.get(PASS_RATE_B), row.get(PASS_RATE_A))
        rows.append(row)
    rows.sort(key=lambda r: (r[DELTA] is None, r[DELTA] if r[DELTA] is not None else 0.0))
    return pa.Table.from_pylist(rows, schema=COMPARE_SCHEMA)


def recorded_configs(path: TracePaths) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each trace file under ``path`` with the tracer config it was recorded with (unreadable ones left out)."""
    for file in list_trace_files(path):
        try:
            config = json.loads(read_file_metadata(file).get(S.META_CONFIG) or "{}")
        except (OSError, ValueError, pa.ArrowException):
            continue
        if isinstance(config, dict):
            yield file, config


def read_run_config(path: TracePaths) -> dict[str, Any]:
    """The training config a run recorded (``tracer.init(run_config=...)``), from the newest file holding one."""
    configs = dict(recorded_configs(path))
    for file in sorted(configs, key=lambda f: os.path.getmtime(f) if os.path.exists(f) else 0, reverse=True):
        run_config = configs[file].get(RUN_CONFIG_KEY)
        if isinstance(run_config, Mapping) and run_config:
            return dict(run_config)
    return {}


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_config(value, full + "."))
        else:
            out[full] = value
    return out


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return bool(x == y) and type(x) is type(y)


#: :func:`diff_configs` marks a key one run lacks with this.
MISSING = "<not set>"


def diff_configs(config_a: Mapping[str, Any], config_b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """The dotted keys whose values differ between two configs: ``(key, value_a, value_b)``, by key; a key
    only one config has shows :data:`MISSING` on the other side."""
    fa, fb = flatten_config(config_a), flatten_config(config_b)
    rows = [(key, fa.get(key, MISSING), fb.get(key, MISSING)) for key in sorted(fa.keys() | fb.keys())]
    return [row for row in rows if not _same(row[1], row[2])]
