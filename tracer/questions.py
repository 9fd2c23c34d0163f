"""A trajectory's question (:func:`question_of`) and final answer (the last assistant turn's text), and a group's
ground truth (a ``log_reward`` extra): what the pages name a rollout by."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer.schema import ROLLOUT_N, SAMPLE_INDEX, STEP, TRACE_ID, VALIDATE
from tracer.summary import ROLE_ASSISTANT, ROLE_USER, Turn, span_turns, trajectory_turns
from tracer.summary.turns import rows_by_trace

#: ``log_reward`` extras read as the ground truth, first found wins (``answer`` is the rollout's parsed answer).
GROUND_TRUTH_KEYS = ("ground_truth", "reference", "target", "expected", "gold", "solution", "label")

# The user blocks of a templated prompt: ChatML (Qwen) and Llama 3.
_USER_BLOCKS = (
    re.compile(r"<\|im_start\|>user\s*\n(.*?)(?:<\|im_end\|>|$)", re.S),
    re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\s*(.*?)(?:<\|eot_id\|>|$)", re.S),
)


def question_of(turns: Sequence[Turn], generated: int | None = None) -> str | None:
    """The last user turn before the model's first reply; ``generated``: how many assistant turns the model
    produced (its llm spans; None: all), those before them being part of the prompt (few-shot examples)."""
    assistant = [i for i, t in enumerate(turns) if t.role == ROLE_ASSISTANT]
    skip = len(assistant) - generated if generated and generated <= len(assistant) else 0
    first = assistant[skip] if assistant else len(turns)
    user = next((t for t in reversed(turns[:first]) if t.role == ROLE_USER), None)
    if user is None:
        return None
    # A templated prompt's last user block, else the text as it is.
    blocks = next((found for pattern in _USER_BLOCKS if (found := pattern.findall(user.text or ""))), None)
    return str(blocks[-1]).strip() if blocks else user.text or ""


def answer_of(turns: Sequence[Turn]) -> str | None:
    """The final answer: the last assistant turn's text (None when the model never replied)."""
    last = next((t for t in reversed(turns) if t.role == ROLE_ASSISTANT), None)
    return None if last is None else last.text or last.response_text or ""


def questions_and_answers(spans: pa.Table | Iterable[Mapping[str, Any]]) -> dict[str, tuple[str | None, str | None]]:
    """(question, final answer) of every trajectory in ``spans``, by trace id."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for tid, rows in rows_by_trace(spans).items():
        turns = next(iter(trajectory_turns(rows).values()), [])
        generated = sum(1 for t in span_turns(rows) if t.role == ROLE_ASSISTANT)
        out[tid] = (question_of(turns, generated or None), answer_of(turns))
    return out


def ground_truth(reward_info: str | Mapping[str, Any] | None) -> str | None:
    """The ground truth among ``log_reward``'s extras (JSON text or a mapping), None when not given."""
    info: Any = reward_info
    if isinstance(reward_info, str):
        try:
            info = json.loads(reward_info)
        except ValueError:
            return None
    if not isinstance(info, Mapping):
        return None
    for key in GROUND_TRUTH_KEYS:
        value = info.get(key)
        if value is not None and value != "":
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return None


#: Hex digits of a trace id that name the process that wrote it (the recorder's ids: a process prefix, a counter).
WRITER_ID_CHARS = 16


def repeated_keys(trajectories: pa.Table) -> list[dict[str, Any]]:
    """The (step, sample_index, rollout_n, validate) keys held by more than one trajectory (a run recorded twice
    under one name, verl numbering ``rollout_n`` per worker): the key, ``attempts`` (trajectories with it) and
    ``writers`` (distinct trace id prefixes, :data:`WRITER_ID_CHARS`)."""
    keys = [STEP, SAMPLE_INDEX, ROLLOUT_N, VALIDATE]
    t = trajectories.select([*keys, TRACE_ID])
    t = t.set_column(3, VALIDATE, pc.fill_null(t.column(VALIDATE), False))
    t = t.append_column("writer", pc.utf8_slice_codeunits(t.column(TRACE_ID), 0, WRITER_ID_CHARS))
    g = t.group_by(keys, use_threads=False).aggregate([(TRACE_ID, "count"), ("writer", "count_distinct")])
    g = g.filter(pc.greater(g.column(f"{TRACE_ID}_count"), 1))
    rows = [
        {**{k: r[k] for k in keys}, "attempts": r[f"{TRACE_ID}_count"], "writers": r["writer_count_distinct"]}
        for r in g.to_pylist()
    ]
    return sorted(rows, key=lambda r: (r[STEP] is None, r[STEP] or 0, str(r[SAMPLE_INDEX]), r[ROLLOUT_N] or 0))


def describe_repeats(repeats: Sequence[Mapping[str, Any]]) -> str:
    """One line saying how many keys repeat, with the first few (empty when none)."""
    if not repeats:
        return ""
    first = ", ".join(
        f"(step {r[STEP]}, sample {r[SAMPLE_INDEX]}, rollout {r[ROLLOUT_N]}) x{r['attempts']}" for r in repeats[:3]
    )
    more = f" and {len(repeats) - 3} more" if len(repeats) > 3 else ""
    writers = max(r["writers"] for r in repeats)
    return (
        f"{len(repeats)} (step, sample, rollout) keys are held by more than one trajectory: {first}{more}; "
        f"up to {writers} writers. Each attempt keeps its own trace id; nothing was merged."
    )
