"""The Compare page's data: two runs (or two steps of one run) prompt by prompt.

The numbers are :func:`tracer.compare_runs`'; the configuration differences
:func:`tracer.compare.diff_configs` of the runs' recorded ``run_config``; the final
answers come from the one trajectory model (:mod:`tracer.summary`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import tracer
from tracer.compare import PROMPT, QUESTION, TRACE_ID_A, TRACE_ID_B
from tracer.schema import ROLLOUT_N, SAMPLE_INDEX, STEP, VALIDATE
from tracer.summary import prompt_and_response, trajectory_turns
from viewer.data.runs import Loaded, _reading
from viewer.format import one_line

#: Columns naming each side's example trajectory.
COMPARE_TRACE_IDS = (TRACE_ID_A, TRACE_ID_B)

#: Characters of a prompt the comparison table shows (the selected prompt shows all of it).
PROMPT_CHARS = 120


def load_comparison(
    run_a: str, run_b: str, steps_a: Iterable[int] | None = None, steps_b: Iterable[int] | None = None
) -> Loaded:
    """:func:`tracer.compare_runs` of the two runs, with the readers' warnings."""
    return _reading(
        tracer.compare_runs,
        run_a,
        run_b,
        steps_a=None if steps_a is None else list(steps_a),
        steps_b=None if steps_b is None else list(steps_b),
    )


def comparison_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The comparison as the table shows it: one row per prompt, its question (else prompt) on one line."""
    rows = []
    for r in table.to_pylist():
        r[QUESTION] = one_line(r[QUESTION] or r[PROMPT], PROMPT_CHARS)
        r[PROMPT] = one_line(r[PROMPT], PROMPT_CHARS)
        rows.append(r)
    return rows


def config_differences(run_a: str, run_b: str) -> list[dict[str, Any]]:
    """The training settings that differ between the two runs' recorded configs: key, A, B (as text)."""
    diff = tracer.compare.diff_configs(tracer.read_run_config(run_a), tracer.read_run_config(run_b))
    return [{"setting": k, "A": repr(a), "B": repr(b)} for k, a, b in diff]


def prompt_rollouts(trajectories: pa.Table, sample_index: str, validate: bool) -> pa.Table:
    """The trajectories of one prompt (sample index and split), by step and rollout."""
    t = trajectories.filter(
        pc.and_(
            pc.equal(trajectories.column(SAMPLE_INDEX), sample_index),
            pc.equal(pc.fill_null(trajectories.column(VALIDATE), False), validate),
        )
    )
    return t.sort_by([(STEP, "ascending"), (ROLLOUT_N, "ascending")])


def final_answers(spans: pa.Table) -> dict[str, str]:
    """Each trajectory's final response as text (:func:`tracer.summary.prompt_and_response`), by trace id."""
    return {tid: prompt_and_response(turns)[1] for tid, turns in trajectory_turns(spans).items()}


def answer_diff(a: str, b: str) -> str:
    """A unified diff of two final answers, line by line (words when both are one line)."""
    left, right = a.splitlines() or [""], b.splitlines() or [""]
    if len(left) == 1 and len(right) == 1:
        left, right = a.split(), b.split()
    lines = difflib.unified_diff(left, right, "A", "B", lineterm="", n=3)
    return "\n".join(lines) or "(the answers are the same)"
