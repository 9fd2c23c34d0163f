"""Multi-turn history stored once: an llm span's ``prompt_ids`` as a reference to the turn before.

The writer (:class:`HistoryTracker`) stores, in the span's ``inputs`` JSON::

    "prompt_ids": {"rollout_trace.extends": "<span id of the earlier llm span>",
                   "prefix": k, "response": "response_ids", "ids": [...new ids...]}

meaning the first ``k`` ids of (that span's full ``prompt_ids`` then its ``outputs[response]``), then ``ids``.
:func:`expand_history` (called by :func:`tracer.read_spans`) rebuilds the list; when the earlier span was not
read, the reference stays, with ``"rollout_trace.missing"`` saying why (``docs/format.md``).
"""

from __future__ import annotations

import collections
import functools
import json
from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S

#: The ``inputs`` key whose token ids are stored once.
PROMPT_FIELD = "prompt_ids"
#: ``outputs`` keys holding the response ids that the next prompt repeats (first found wins).
RESPONSE_FIELDS = ("response_ids", "token_ids", "output_ids")
#: Shortest shared prefix worth a reference (shorter prompts are stored whole).
MIN_PREFIX = 32
#: Most token ids the writer keeps to compare the next turn against (~36 bytes an id): past this the oldest
#: trajectories are forgotten and their next turn is stored whole.
MAX_HELD_IDS = 2_000_000

#: Columns :func:`expand_history` needs besides ``inputs``.
HISTORY_COLUMNS = (S.TRACE_ID, S.SPAN_ID, S.OUTPUTS)

_MARKER = f'"{S.HISTORY_EXTENDS}"'


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of the lists or tuples ``a`` and ``b`` (slices compare in C)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if type(b) is not type(a):
        b = tuple(b) if type(a) is tuple else list(b)
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] matches, a[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class HistoryTracker:
    """The writer thread's side: remembers each trajectory's last llm context (by reference), rewrites the next one."""

    def __init__(self) -> None:
        #: trajectory key -> (span id, response field, whole prompt ids, response ids)
        self._last: collections.OrderedDict[Any, tuple[str, str | None, Sequence[int], Sequence[int]]] = (
            collections.OrderedDict()
        )
        self._held = 0

    def clear(self) -> None:
        """Forget every trajectory (the writer started a new file)."""
        self._last.clear()
        self._held = 0

    def end(self, key: Any) -> Any:
        """The trajectory ended: forget its context (returned; None when there is none)."""
        old = self._last.pop(key, None)
        if old is not None:
            self._held -= len(old[2]) + len(old[3])
        return old

    def encode(self, key: Any, span_id: str, inputs: Any, outputs: Any) -> None:
        """Replace ``inputs["prompt_ids"]`` by a reference when it extends the trajectory's last llm context."""
        if not isinstance(inputs, dict):
            return
        prompt = inputs.get(PROMPT_FIELD)
        if type(prompt) is not list and type(prompt) is not tuple:
            return
        found = ((k, v) for k in RESPONSE_FIELDS if type(v := outputs.get(k)) in (list, tuple))
        field, response = next(found, (None, ())) if isinstance(outputs, dict) else (None, ())
        prev = self.end(key)
        if prev is not None:
            base_span, base_field, base_prompt, base_response = prev
            k = _common_prefix(prompt, base_prompt) if base_span != span_id else 0
            if k == len(base_prompt):
                k += _common_prefix(prompt[k:], base_response)
            if k >= MIN_PREFIX:
                inputs[PROMPT_FIELD] = {
                    S.HISTORY_EXTENDS: base_span,
                    S.HISTORY_PREFIX: k,
                    S.HISTORY_RESPONSE: base_field,
                    S.HISTORY_IDS: prompt[k:],
                }
        size = len(prompt) + len(response)
        if size > MAX_HELD_IDS:
            return
        self._last[key] = (span_id, field, prompt, response)
        self._held += size
        while self._held > MAX_HELD_IDS and self._last:
            self.end(next(iter(self._last)))


def _loads(text: Any) -> Any:
    try:
        return None if text is None else orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def expand_history(table: pa.Table) -> pa.Table:
    """``table`` with every referenced ``prompt_ids`` rebuilt from its own rows (a reference that cannot be stays, with
    ``rollout_trace.missing`` naming why); needs :data:`HISTORY_COLUMNS` beside ``inputs`` (else returned as it is)."""
    if S.INPUTS not in table.column_names or table.num_rows == 0:
        return table
    inputs = table.column(S.INPUTS)
    marked = pc.fill_null(pc.match_substring(inputs, _MARKER), False)  # one substring scan
    if not pc.any(marked).as_py():
        return table
    missing_cols = [c for c in HISTORY_COLUMNS if c not in table.column_names]
    if missing_cols:
        raise ValueError(f"expand_history needs the columns {', '.join(missing_cols)} to rebuild prompt_ids")
    marked_rows = pc.indices_nonzero(marked)
    trace_col = table.column(S.TRACE_ID)
    traces = pc.unique(trace_col.take(marked_rows))
    in_traces = pc.indices_nonzero(pc.fill_null(pc.is_in(trace_col, value_set=traces), False))
    sub = table.select([S.TRACE_ID, S.SPAN_ID, S.INPUTS, S.OUTPUTS]).take(in_traces)
    trace_of, span_of, sub_inputs, sub_outputs = (column.to_pylist() for column in sub.columns)
    rows = dict(zip(zip(trace_of, span_of), range(sub.num_rows)))
    resolved: dict[int, list[int] | str] = {}

    @functools.cache
    def inputs_of(i: int) -> Any:
        return _loads(sub_inputs[i])

    def prompt_of(i: int) -> Any:
        data = inputs_of(i)
        return data.get(PROMPT_FIELD) if isinstance(data, dict) else None

    def resolve(i: int, depth: int = 0) -> list[int] | str:
        """Row ``i``'s full prompt_ids, or why it cannot be rebuilt."""
        if i not in resolved:
            resolved[i] = "circular reference"  # until resolved: a cycle finds this
            resolved[i] = rebuild(i, depth)
        return resolved[i]

    def rebuild(i: int, depth: int) -> list[int] | str:
        value = prompt_of(i)
        if isinstance(value, list):
            return value
        if not isinstance(value, dict) or S.HISTORY_EXTENDS not in value:
            return "no prompt_ids"
        if depth > 10_000:
            return "reference chain too long"
        base, earlier = rows.get((trace_of[i], value[S.HISTORY_EXTENDS])), f"earlier span {value[S.HISTORY_EXTENDS]!r}"
        k, ids, field = value.get(S.HISTORY_PREFIX), value.get(S.HISTORY_IDS), value.get(S.HISTORY_RESPONSE)
        if base is None:
            return f"{earlier} not in what was read"
        if type(k) is not int or type(ids) is not list:
            return "damaged reference"
        prefix = resolve(base, depth + 1)
        if isinstance(prefix, str):
            return f"{earlier}: {prefix}"
        outputs = {None: []} if field is None else _loads(sub_outputs[base])  # no field: no response ids
        response = outputs.get(field) if isinstance(outputs, dict) else None
        if type(response) is not list:
            return f"{earlier} has no {field}"
        if len(prefix) + len(response) < k:
            return f"{earlier} holds fewer than {k} ids"
        return (prefix + response if len(prefix) < k else prefix)[:k] + ids

    sub_index = {row: n for n, row in enumerate(in_traces.to_pylist())}
    new_values = []
    for row in marked_rows.to_pylist():
        i = sub_index[row]
        ref = prompt_of(i)
        if not isinstance(ref, dict) or S.HISTORY_EXTENDS not in ref:  # the marker text inside some string
            new_values.append(sub_inputs[i])
            continue
        full = resolve(i)
        data = {**inputs_of(i), PROMPT_FIELD: full if isinstance(full, list) else {**ref, S.HISTORY_MISSING: full}}
        try:
            new_values.append(orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS).decode("utf-8"))
        except TypeError:  # a lone surrogate (written escaped by the json module): same fallback as the writer
            new_values.append(json.dumps(data))
    column = _replaced(inputs, marked, new_values)
    return table.set_column(table.column_names.index(S.INPUTS), S.INPUTS, column)


def _replaced(inputs: pa.ChunkedArray, marked: pa.ChunkedArray, values: list[str]) -> pa.ChunkedArray:
    """``inputs`` with its ``marked`` rows replaced by ``values``, by chunk (one string array could pass 2 GiB)."""
    chunks, start, used = [], 0, 0
    for chunk in inputs.chunks:
        mask = marked.slice(start, len(chunk)).combine_chunks()
        count = int(pc.sum(mask).as_py() or 0)
        if count:
            chunk = pc.replace_with_mask(chunk, mask, pa.array(values[used : used + count], pa.string()))
        chunks.append(chunk)
        start += len(chunk)
        used += count
    return pa.chunked_array(chunks, pa.string())
