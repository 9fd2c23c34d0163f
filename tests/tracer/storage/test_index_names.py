"""The span names a shard index lists: ``tracer.read.has_spans_named`` answers from them as a scan of every name would."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_fixtures import write_shard

import tracer
from tracer import schema as S
from tracer.index.shard import INDEX_SUFFIX, MAX_INDEX_NAMES, load_shard_index, shard_index_path
from tracer.read import has_spans_named

pytestmark = pytest.mark.usefixtures("shard_indexes_alone")  # the indexes' own answers, not the rollup's

NAMES = ["agent_loop", "generate", "calculator", "log_token_stats", "log_reward", "ünïcode"]


def _row(trace: str, n: int, name: str, step: int) -> dict[str, Any]:
    return {
        S.TRACE_ID: trace,
        S.SPAN_ID: f"{trace}-{n}",
        S.PARENT_SPAN_ID: None if n == 0 else f"{trace}-0",
        S.NAME: name,
        S.KIND: S.KIND_ROLLOUT if n == 0 else S.KIND_SPAN,
        S.START_NS: 1_000 + n,
        S.END_NS: 2_000 + n,
        S.STATUS: S.STATUS_OK,
        S.STEP: step,
        S.SAMPLE_INDEX: "0",
        S.ROLLOUT_N: 0,
        S.VALIDATE: False,
    }


def _scan(run: str) -> set[str]:
    """Every span name under ``run``, from the name column of every file."""
    return {n for n in tracer.read_spans(run, columns=[S.NAME]).column(S.NAME).to_pylist() if n is not None}


shards = st.lists(
    st.tuples(
        st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4), min_size=1, max_size=3),
        st.sampled_from(["closed", "killed", "no index", "names removed", "names garbage"]),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shards=shards, asked=st.sampled_from([*NAMES, "never recorded"]))
def test_has_spans_named_equals_a_scan_of_every_name(shards: list[tuple[list[list[str]], str]], asked: str) -> None:
    """Any mix of closed, killed, unindexed and tampered shards: the answer is the one the name column gives."""
    run = tempfile.mkdtemp(prefix="rt-names-")
    try:
        for i, (batches, how) in enumerate(shards):
            rows = [
                [_row(f"t{i}-{b}", n, name, step=b) for n, name in enumerate(names)] for b, names in enumerate(batches)
            ]
            if how == "killed":
                write_shard(run, rows, close=False)
                continue
            shard = write_shard(run, rows)
            side = shard_index_path(shard)
            if how == "no index":
                os.remove(side)
            elif how in ("names removed", "names garbage"):
                table = pa.ipc.open_file(side).read_all()
                meta = dict(table.schema.metadata)
                if how == "names removed":
                    meta.pop(S.META_INDEX_NAMES.encode())
                else:
                    meta[S.META_INDEX_NAMES.encode()] = json.dumps([1, None]).encode()
                with pa.OSFile(side, "wb") as f, pa.ipc.new_file(f, table.schema.with_metadata(meta)) as w:
                    for batch in table.to_batches():
                        w.write_batch(batch)
        assert has_spans_named(run, asked) == (asked in _scan(run))
    finally:
        shutil.rmtree(run, ignore_errors=True)


def test_a_closed_shard_lists_its_names_and_answers_without_its_spans(tmp_path: Any, monkeypatch: Any) -> None:
    """The index names every span name of its shard, and the answer comes without reading a batch."""
    run = str(tmp_path)
    shard = write_shard(run, [[_row("a", 0, "agent_loop", 1), _row("a", 1, "log_token_stats", 1)]])
    index = load_shard_index(shard)
    assert index is not None and index.names == frozenset({"agent_loop", "log_token_stats"})

    def no_reading(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a batch was read")

    monkeypatch.setattr(tracer.read, "iter_batches", no_reading)
    assert has_spans_named(run, "log_token_stats") and not has_spans_named(run, "generate")


def test_a_shard_with_too_many_names_lists_none_and_is_scanned(tmp_path: Any) -> None:
    """Past MAX_INDEX_NAMES distinct names the index lists none; the name column answers."""
    run = str(tmp_path)
    many = [_row("a", n, f"name-{n}", 1) for n in range(MAX_INDEX_NAMES + 1)]
    shard = write_shard(run, [many])
    index = load_shard_index(shard)
    assert index is not None and index.names is None
    assert has_spans_named(run, f"name-{MAX_INDEX_NAMES}") and not has_spans_named(run, "other")
    assert not [f for f in os.listdir(run) if f.endswith(INDEX_SUFFIX + ".tmp")]
