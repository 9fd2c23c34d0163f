"""Staleness of asynchronous rollouts: which weight versions generated each trajectory, and how far behind.

Async RL (verl's fully-async trainer, AReaL, miles) generates with policies
one or more versions behind the trainer. A trajectory's weight version is
recorded where the rollout knows it:

- on the trajectory: ``tracer.rollout_trace_attr(..., weight_version=v)``;
- on each llm call, from what the engine returns: a ``weight_version`` key
  (this project's engines, SGLang's ``meta_info``), verl's ``TokenOutput``
  ``extra_fields.global_steps`` (its async servers stamp the parameter
  version there, so the verl drop-in records it without configuration), or
  per-token versions (AReaL's ``output_versions``).

:func:`read_staleness` turns these into one row per trajectory (the
versions, staleness = step minus the oldest version, whether more than one
version generated it); :func:`step_staleness` counts each step's
distribution. Trajectories without any version are left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracer import schema as S
from tracer.read import TracePaths, read_spans

#: Keys of an llm span's outputs that hold the version of the weights that produced it.
VERSION_KEYS = (S.ATTR_WEIGHT_VERSION, "global_steps", "param_version")
#: Keys holding one version per generated token.
TOKEN_VERSION_KEYS = ("output_versions", "weight_versions", "versions")
#: Nested mappings of an output searched too (SGLang's ``meta_info``, verl's ``extra_fields``).
NESTED_KEYS = ("meta_info", "extra_fields")
_COLUMNS = (S.TRACE_ID, S.STEP, S.VALIDATE, S.KIND, S.PARENT_SPAN_ID, S.ATTRIBUTES, S.OUTPUTS)


def read_staleness(path: TracePaths, steps: int | Iterable[int] | None = None) -> pa.Table:
    """One row of :data:`tracer.schema.STALENESS_SCHEMA` per trajectory under ``path`` that carries a weight version."""
    spans = read_spans(path, columns=_COLUMNS, steps=steps)
    root = pc.is_null(spans[S.PARENT_SPAN_ID])
    llm = pc.equal(spans[S.KIND], S.KIND_LLM)
    # Parse JSON only where a version can be: roots' attributes and llm outputs that spell one.
    wanted = pc.or_(
        pc.and_(root, pc.match_substring(pc.fill_null(spans[S.ATTRIBUTES], ""), S.ATTR_WEIGHT_VERSION)),
        pc.and_(llm, pc.match_substring_regex(pc.fill_null(spans[S.OUTPUTS], ""), "version|global_steps")),
    )
    versions: dict[str, set[int]] = {}
    keys: dict[str, tuple[Any, Any]] = {}
    for row in spans.filter(pc.fill_null(wanted, False)).to_pylist():
        tid = row[S.TRACE_ID]
        if row[S.PARENT_SPAN_ID] is None:
            found = _versions(_loads(row[S.ATTRIBUTES]), (S.ATTR_WEIGHT_VERSION,), ())
            keys[tid] = (row[S.STEP], row[S.VALIDATE])
        else:
            found = _versions(_loads(row[S.OUTPUTS]), VERSION_KEYS, TOKEN_VERSION_KEYS)
            keys.setdefault(tid, (row[S.STEP], row[S.VALIDATE]))
        if found:
            versions.setdefault(tid, set()).update(found)
    rows = []
    for tid, found in versions.items():
        step, validate = keys[tid]
        ordered = sorted(found)
        rows.append(
            {
                S.TRACE_ID: tid,
                S.STEP: step,
                S.VALIDATE: validate,
                S.WEIGHT_VERSIONS: ordered,
                S.STALENESS: None if step is None else step - ordered[0],
                S.MIXED_VERSIONS: len(ordered) > 1,
            }
        )
    rows.sort(key=lambda r: (r[S.STEP] is None, r[S.STEP] or 0, r[S.TRACE_ID]))
    return pa.Table.from_pylist(rows, schema=S.STALENESS_SCHEMA)


def step_staleness(staleness: pa.Table) -> list[dict[str, Any]]:
    """Each step's distribution: ``{step, trajectories, staleness: {value: count}, mean, max, mixed_versions}``."""
    by_step: dict[Any, list[dict[str, Any]]] = {}
    for row in staleness.to_pylist():
        by_step.setdefault(row[S.STEP], []).append(row)
    out = []
    for step, rows in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        values = [r[S.STALENESS] for r in rows if r[S.STALENESS] is not None]
        counts: dict[int, int] = {}
        for v in sorted(values):
            counts[v] = counts.get(v, 0) + 1
        out.append(
            {
                S.STEP: step,
                "trajectories": len(rows),
                S.STALENESS: counts,
                "mean": sum(values) / len(values) if values else None,
                "max": max(values) if values else None,
                S.MIXED_VERSIONS: sum(1 for r in rows if r[S.MIXED_VERSIONS]),
            }
        )
    return out


def _loads(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _versions(value: Any, keys: tuple[str, ...], token_keys: tuple[str, ...]) -> set[int]:
    """The integer versions ``value`` (a span's attributes or outputs) holds under ``keys`` (also nested)."""
    found: set[int] = set()
    if not isinstance(value, Mapping):
        return found
    for key in keys:
        v = value.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            found.add(v)
    for key in token_keys:
        v = value.get(key)
        if isinstance(v, list):
            found.update(x for x in v if isinstance(x, int) and not isinstance(x, bool) and x >= 0)
    for key in NESTED_KEYS:
        found |= _versions(value.get(key), keys, token_keys)
    return found
