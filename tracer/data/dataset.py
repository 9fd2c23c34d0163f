"""Recorded trajectories as a training dataset: one row per trajectory or per model turn.

:func:`to_dataset` (``rollout-trace dataset RUN --out DIR``) gives a table of :data:`DATASET_SCHEMA`: OpenAI
``messages``, the RL token view, reward, advantage and keys; ``datasets.load_dataset("parquet", data_dir=DIR)``
loads its Parquet splits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracer import schema as S  # noqa: N812 - the schema module, short as in tracer/read.py
from tracer.exporters.tables import RunFiles, iter_step_chunks, open_run
from tracer.summary import (
    ROLE_ASSISTANT,
    TURN_SPAN_COLUMNS,
    Turn,
    content_text,
    span_turns,
    trajectory_tokens,
    trajectory_turns,
)
from tracer.summary.turns import openai_tool_call

# Column names of the dataset (those not named in tracer.schema).
MESSAGES = "messages"
PROMPT_IDS = "prompt_ids"
RESPONSE_IDS = "response_ids"
RESPONSE_MASK = "response_mask"
LOGPROBS = "logprobs"
ADVANTAGE = "advantage"
TURN_INDEX = "turn_index"
NUM_TURNS = "num_turns"
EXACT = "tokens_exact"

#: ``per=`` values.
PER_TRAJECTORY = "trajectory"
PER_TURN = "turn"
PER_CHOICES = (PER_TRAJECTORY, PER_TURN)
#: ``split=`` values, also the file names written (``train.parquet``, ``validation.parquet``).
SPLIT_TRAIN = "train"
SPLIT_VALIDATION = "validation"
SPLIT_CHOICES = (SPLIT_TRAIN, SPLIT_VALIDATION)
#: ``format=`` values.
FORMAT_PARQUET = "parquet"
FORMAT_JSONL = "jsonl"
FORMAT_CHOICES = (FORMAT_PARQUET, FORMAT_JSONL)

_TOOL_CALL = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("type", pa.string()),
        pa.field("function", pa.struct([pa.field("name", pa.string()), pa.field("arguments", pa.string())])),
    ]
)
#: One chat message (OpenAI format; content always text).
MESSAGE_TYPE = pa.struct(
    [
        pa.field("role", pa.string()),
        pa.field("content", pa.string()),
        pa.field("tool_calls", pa.list_(_TOOL_CALL)),
        pa.field("tool_call_id", pa.string()),
        pa.field("name", pa.string()),
    ]
)

#: (name, type, description) of every dataset column, in order.
DATASET_FIELDS: tuple[tuple[str, pa.DataType, str], ...] = (
    (MESSAGES, pa.list_(MESSAGE_TYPE), "The conversation in OpenAI chat format, tool calls and tool results included."),
    (PROMPT_IDS, pa.list_(pa.int32()), "Token ids of the first model call's prompt (of the turn's call, per turn)."),
    (RESPONSE_IDS, pa.list_(pa.int32()), "Token ids after the prompt: model turns, tool/env tokens in between."),
    (RESPONSE_MASK, pa.list_(pa.int8()), "1 for a token the model produced, 0 for a spliced-in one."),
    (LOGPROBS, pa.list_(pa.float32()), "The model's logprob of each response token (null where unknown or spliced)."),
    (S.REWARD, pa.float64(), "The trajectory's latest reward (tracer.read_trajectories)."),
    (ADVANTAGE, pa.float64(), "The advantage logged with the latest reward that has one; null if none."),
    (S.STEP, pa.int64(), "Training step."),
    (S.SAMPLE_INDEX, pa.string(), "Prompt (sample) id."),
    (S.ROLLOUT_N, pa.int64(), "Rollout index within the group."),
    (S.VALIDATE, pa.bool_(), "Validation rollout."),
    (S.TRACE_ID, pa.string(), "Trajectory id in the trace files."),
    (S.STATUS, pa.string(), "The trajectory's status (ok, error, cancelled, incomplete)."),
    (NUM_TURNS, pa.int64(), "Model calls in the trajectory."),
    (TURN_INDEX, pa.int64(), "Per-turn rows: which model turn (0-based); null for per-trajectory rows."),
    (EXACT, pa.bool_(), "False when a token list was cut by the tracer or a turn's prompt re-templated the history."),
)
DATASET_COLUMNS: tuple[str, ...] = tuple(f[0] for f in DATASET_FIELDS)
DATASET_SCHEMA = pa.schema([pa.field(n, t) for n, t, _ in DATASET_FIELDS])

#: Fields ``filter=`` expressions may name -> trajectory summary column.
FILTER_FIELDS: dict[str, str] = {
    "reward": S.REWARD,
    "status": S.STATUS,
    "turns": S.NUM_LLM_CALLS,
    "tool_calls": S.NUM_TOOL_CALLS,
    "tool_errors": S.NUM_TOOL_ERRORS,
    "errors": S.NUM_ERRORS,
    "step": S.STEP,
}
_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "==": pc.equal,
    "!=": pc.not_equal,
    ">=": pc.greater_equal,
    "<=": pc.less_equal,
    ">": pc.greater,
    "<": pc.less,
}
_FILTER_RE = re.compile(r"^\s*([a-z_]+)\s*(==|!=|>=|<=|>|<|=)\s*(.+?)\s*$")


class DatasetOptionError(ValueError):
    """A bad ``steps``, ``split``, ``filter``, ``per`` or ``format`` value (the message names it and the fix)."""


def parse_steps(spec: str | int | Iterable[int] | None, available: Sequence[int]) -> list[int] | None:
    """The steps ``spec`` selects among ``available`` (None: all): an int, ints, or text ``"3"``, ``"1,4"``,
    ``"2-5"``, ``"4-"`` (4 and later), ``"last:3"`` (3 latest), parts combined; DatasetOptionError for other text."""
    if spec is None:
        return None
    if isinstance(spec, int):
        return [spec]
    if not isinstance(spec, str):
        return sorted({int(s) for s in spec})
    have = sorted(set(available))
    out: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        m_last = re.fullmatch(r"last:(\d+)", part)
        m_range = re.fullmatch(r"(\d+)-(\d*)", part)
        if m_last:
            out.update(have[-int(m_last.group(1)) :] if int(m_last.group(1)) else [])
        elif m_range:
            lo = int(m_range.group(1))
            hi = int(m_range.group(2)) if m_range.group(2) else math.inf
            out.update(s for s in have if lo <= s <= hi)
        elif part.isdigit():
            out.add(int(part))
        else:
            raise DatasetOptionError(
                f"steps {spec!r}: cannot read {part!r}; give N, N,M, N-M, N- (N and later) or last:K"
            )
    return sorted(out)


def filter_mask(trajectories: pa.Table, filters: str | Sequence[str] | None) -> pa.Array:
    """Which trajectory summaries every ``filters`` expression (``FIELD OP VALUE``, fields :data:`FILTER_FIELDS`,
    ops ``== != >= <= > <``, ``=`` is ``==``) keeps; one without the field's value is dropped. DatasetOptionError
    for an expression that does not parse, an unknown field, or a number field compared with text."""
    keep = pa.array([True] * trajectories.num_rows, pa.bool_())
    exprs = [filters] if isinstance(filters, str) else list(filters or ())
    for expr in exprs:
        m = _FILTER_RE.match(expr)
        if m is None:
            raise DatasetOptionError(
                f"filter {expr!r} is not FIELD OP VALUE; e.g. 'reward>=1', 'status==ok', 'turns<=3'"
            )
        field, op, text = m.group(1), m.group(2), m.group(3)
        column = FILTER_FIELDS.get(field)
        if column is None:
            raise DatasetOptionError(f"filter {expr!r}: unknown field {field!r}; fields are {', '.join(FILTER_FIELDS)}")
        func = _OPS["==" if op == "=" else op]
        try:
            value = text.strip("'\"") if field == "status" else float(text)
        except ValueError:
            raise DatasetOptionError(f"filter {field}: {text!r} is not a number; e.g. {field}>=1") from None
        keep = pc.and_(keep, pc.fill_null(func(trajectories[column], value), False))
    return keep


def select(
    run: RunFiles,
    steps: str | int | Iterable[int] | None = None,
    split: str | None = None,
    filters: str | Sequence[str] | None = None,
) -> RunFiles:
    """``run`` with only the trajectories of the chosen steps and split that pass ``filters``."""
    t = run.trajectories
    if split is not None and split not in SPLIT_CHOICES:
        raise DatasetOptionError(f"split {split!r} is not valid; give {' or '.join(SPLIT_CHOICES)}")
    wanted = parse_steps(steps, [s for s in t[S.STEP].to_pylist() if s is not None])
    mask = filter_mask(t, filters)
    if wanted is not None:
        mask = pc.and_(mask, pc.fill_null(pc.is_in(t[S.STEP], value_set=pa.array(wanted, pa.int64())), False))
    if split is not None:
        mask = pc.and_(mask, pc.equal(pc.fill_null(t[S.VALIDATE], False), split == SPLIT_VALIDATION))
    chosen = t.filter(mask)
    return dataclasses.replace(run, trajectories=chosen, not_selected=run.not_selected + t.num_rows - chosen.num_rows)


def _message(turn: Turn) -> dict[str, Any]:
    """A turn as a row of :data:`MESSAGE_TYPE`."""
    content = content_text(turn.content) if turn.content is not None else turn.text
    return {
        "role": turn.role,
        "content": content if content is not None else "",
        "tool_calls": [openai_tool_call(c) for c in turn.tool_calls] or None,
        "tool_call_id": turn.tool_call_id,
        "name": turn.tool_name,
    }


def _keys(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The columns a trajectory's rows share; the advantage is its reward_info's (None when absent or not a number)."""
    keys = {c: summary[c] for c in (S.REWARD, S.STEP, S.SAMPLE_INDEX, S.ROLLOUT_N, S.TRACE_ID, S.STATUS)}
    info = S.parse_json_or_text(summary.get(S.REWARD_INFO))
    adv = info.get("advantage") if isinstance(info, Mapping) else None
    adv = float(adv) if isinstance(adv, (int, float)) and not isinstance(adv, bool) else None
    return {**keys, ADVANTAGE: adv, S.VALIDATE: bool(summary[S.VALIDATE]), NUM_TURNS: summary[S.NUM_LLM_CALLS]}


def trajectory_rows(summary: Mapping[str, Any], spans: Sequence[Mapping[str, Any]], per: str) -> list[dict[str, Any]]:
    """The dataset rows of one trajectory: its summary row and its span rows."""
    turns = trajectory_turns(spans).get(summary[S.TRACE_ID], [])
    keys = _keys(summary)
    if per == PER_TRAJECTORY:
        tokens = trajectory_tokens(span_turns(spans))
        return [
            {
                MESSAGES: [_message(t) for t in turns],
                PROMPT_IDS: tokens.prompt_ids,
                RESPONSE_IDS: tokens.response_ids,
                RESPONSE_MASK: tokens.response_mask,
                LOGPROBS: tokens.logprobs,
                **keys,
                TURN_INDEX: None,
                EXACT: tokens.exact,
            }
        ]
    rows = []
    for n, i in enumerate(i for i, t in enumerate(turns) if t.role == ROLE_ASSISTANT):
        turn = turns[i]
        ids = [int(x) for x in turn.token_ids or ()]
        lps = list(turn.logprobs or ())[: len(ids)]
        rows.append(
            {
                MESSAGES: [_message(t) for t in turns[: i + 1]],
                PROMPT_IDS: list(turn.prompt_ids) if turn.prompt_ids is not None else None,
                RESPONSE_IDS: ids,
                RESPONSE_MASK: [1] * len(ids),
                LOGPROBS: lps + [None] * (len(ids) - len(lps)),
                **keys,
                TURN_INDEX: n,
                EXACT: not turn.truncated and turn.token_ids is not None,
            }
        )
    return rows


def _check(per: str, fmt: str) -> None:
    for option, value, choices in (("per", per, PER_CHOICES), ("format", fmt, FORMAT_CHOICES)):
        if value not in choices:
            raise DatasetOptionError(f"{option} {value!r} is not valid; give {' or '.join(choices)}")


def iter_dataset(
    path: str | os.PathLike[str],
    *,
    steps: str | int | Iterable[int] | None = None,
    split: str | None = None,
    filters: str | Sequence[str] | None = None,
    per: str = PER_TRAJECTORY,
) -> Iterator[pa.Table]:
    """:func:`to_dataset`'s table, a few steps at a time (tables of :data:`DATASET_SCHEMA`)."""
    _check(per, FORMAT_PARQUET)
    run = select(open_run(path), steps, split, filters)
    columns = tuple(dict.fromkeys((*TURN_SPAN_COLUMNS, S.REWARD)))
    for trajs, spans in iter_step_chunks(run, columns):
        rows = [r for t in trajs.to_pylist() for r in trajectory_rows(t, spans.get(t[S.TRACE_ID], []), per)]
        yield pa.Table.from_pylist(rows, schema=DATASET_SCHEMA)


def to_dataset(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    steps: str | int | Iterable[int] | None = None,
    split: str | None = None,
    filters: str | Sequence[str] | None = None,
    per: str = PER_TRAJECTORY,
    format: str = FORMAT_PARQUET,  # noqa: A002 - the CLI's --format
) -> pa.Table:
    """A run's trajectories as a training dataset: a table of :data:`DATASET_SCHEMA`, by step, sample, rollout.

    ``out``: also write the splits with rows there (``train.<format>``, ``validation.<format>``); ``steps``: see
    :func:`parse_steps`; ``split``: ``"train"`` or ``"validation"`` (default both); ``filters``: expressions that
    must all hold (:func:`filter_mask`); ``per``: ``"trajectory"`` or ``"turn"``; ``format``: ``"parquet"`` or
    ``"jsonl"``. Raises DatasetOptionError for a bad option value, FileNotFoundError when ``path`` has no traces.
    """
    _check(per, format)
    tables = list(iter_dataset(path, steps=steps, split=split, filters=filters, per=per))
    table = pa.concat_tables(tables) if tables else DATASET_SCHEMA.empty_table()
    if out is not None:
        write_dataset(tables, out, format)
    return table


def split_of(table: pa.Table, split: str) -> pa.Table:
    """The rows of ``table`` in ``split`` (``train``: not validate)."""
    return table.filter(pc.equal(pc.fill_null(table[S.VALIDATE], False), split == SPLIT_VALIDATION))


def write_dataset(
    tables: Iterable[pa.Table], out: str | os.PathLike[str], format: str = FORMAT_PARQUET
) -> dict[str, int]:  # noqa: A002
    """Write dataset tables into folder ``out`` (replacing), one file per split with rows; return rows per file."""
    _check(PER_TRAJECTORY, format)
    folder = os.fspath(out)
    os.makedirs(folder, exist_ok=True)
    writers: dict[str, Any] = {}
    counts: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        for table in tables:
            for split in SPLIT_CHOICES:
                part = split_of(table, split)
                if part.num_rows == 0:
                    continue
                name = os.path.join(folder, f"{split}.{format}")
                if name not in writers:
                    writers[name] = stack.enter_context(
                        pq.ParquetWriter(name, DATASET_SCHEMA, compression="zstd")
                        if format == FORMAT_PARQUET
                        else open(name, "wb")  # noqa: SIM115 - closed by the stack
                    )
                w = writers[name]
                if format == FORMAT_PARQUET:
                    w.write_table(part)
                else:
                    for row in part.to_pylist():
                        w.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
                counts[name] = counts.get(name, 0) + part.num_rows
    for split in SPLIT_CHOICES:
        stale = os.path.join(folder, f"{split}.{format}")
        if stale not in writers and os.path.exists(stale):
            os.remove(stale)  # a split this export has no rows for must not keep an older export's rows
    return counts
