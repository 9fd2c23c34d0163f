"""Sampling decisions carried in trace files' metadata, and kept through compaction.

The recorder writes each step's sampling decision into the custom metadata of the batch after it, under
:data:`tracer.schema.BATCH_META_SAMPLING` (a JSON list; later decisions supersede); compaction moves them into the
schema metadata, each naming its ``source_file``. :func:`file_decisions` is the one reader of both places."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from tracer import schema as S

#: Key of the original shard's name in a decision moved by compaction.
SOURCE_FILE = "source_file"

_KEY = S.BATCH_META_SAMPLING.encode()


def _parse(raw: bytes | str | None) -> list[dict[str, Any]]:
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    return [d for d in value if isinstance(d, dict)] if isinstance(value, list) else []


def file_decisions(
    file: str, schema_metadata: Mapping[bytes, bytes] | None, batch_metadata: Iterable[Any]
) -> list[dict[str, Any]]:
    """The latest decision of each ``(source file, step, validate)`` in the trace file ``file`` (the source of
    decisions that name none), from its schema metadata (compaction's) and each batch's, in file order."""
    latest: dict[tuple[str, str, bool], dict[str, Any]] = {}
    own = os.path.basename(file)
    found = _parse((schema_metadata or {}).get(_KEY))
    for custom in batch_metadata:
        found.extend(_parse(None if custom is None else dict(custom).get(_KEY)))
    for d in found:
        source = str(d.get(SOURCE_FILE) or own)
        latest[(source, str(d.get(S.STEP)), bool(d.get(S.VALIDATE)))] = {**d, SOURCE_FILE: source}
    return list(latest.values())


def metadata_value(decisions: list[dict[str, Any]]) -> bytes:
    """``decisions`` as the schema-metadata value :func:`file_decisions` reads."""
    return json.dumps(decisions, separators=(",", ":"), default=str).encode()
