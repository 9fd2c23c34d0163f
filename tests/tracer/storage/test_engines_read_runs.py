"""pyarrow.dataset, Polars and DuckDB open a run's files directly and see the rows tracer.read_spans returns."""

from __future__ import annotations

import glob
import os

import duckdb
import polars as pl
import pyarrow.dataset as pds
import pytest

import tracer
from tracer import schema as S
from tracer.cli import main
from tracer.storage import compact as _compact


@tracer.rollout_trace_op(kind="tool")
def tool(i: int) -> int:
    return i


def _record(trace_dir: str, steps: int = 3, per_step: int = 6) -> str:
    tracer.init(output_dir=trace_dir, max_file_bytes=3000)
    for step in range(steps):
        for i in range(per_step):
            with tracer.rollout_trace_attr(sample_index=i, step=step):
                tool(i)
        tracer.flush()
    tracer.shutdown()
    (run,) = {os.path.dirname(f) for f in tracer.list_trace_files(trace_dir)}
    return run


def _expected(run: str) -> list[tuple[int, str]]:
    table = tracer.read_spans(run, columns=[S.STEP, S.SPAN_ID])
    return sorted(zip(table[S.STEP].to_pylist(), table[S.SPAN_ID].to_pylist()))


def _engines(run: str) -> dict[str, list[tuple[int, str]]]:
    files = sorted(glob.glob(os.path.join(run, "*.arrow")))
    direct = pds.dataset(files, format="ipc")
    ds = tracer.dataset(run)
    polars = pl.scan_ipc(files).select([S.STEP, S.SPAN_ID]).collect()
    return {
        "pyarrow.dataset": sorted(zip(*direct.to_table(columns=[S.STEP, S.SPAN_ID]).to_pydict().values())),
        "polars.scan_ipc": sorted(zip(polars[S.STEP].to_list(), polars[S.SPAN_ID].to_list())),
        "duckdb": sorted(duckdb.sql(f"select {S.STEP}, {S.SPAN_ID} from ds").fetchall()),
        "tracer.dataset": sorted(zip(*ds.to_table(columns=[S.STEP, S.SPAN_ID]).to_pydict().values())),
    }


@pytest.mark.parametrize("compacted", [False, True])
def test_engines_read_closed_shards_and_compacted_files(trace_dir: str, compacted: bool) -> None:
    """Shards as the writer closed them, or compacted: every engine returns read_spans' rows."""
    run = _record(trace_dir)
    if compacted:
        assert _compact.compact(run).files_in > 1
    expected = _expected(run)
    assert len(expected) == 3 * 6 * 2
    for engine, rows in _engines(run).items():
        assert rows == expected, engine


GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "sample_data", "golden", "trace_v1.arrow")


def test_tracer_dataset_includes_open_shards_and_old_streams(trace_dir: str) -> None:
    """tracer.dataset also holds what engines cannot open: a live writer's shard and version-1 streams."""
    tracer.init(output_dir=trace_dir)
    with tracer.rollout_trace_attr(sample_index=0, step=7):
        tool(1)
    tracer.flush()  # the writer is alive: its file has no footer yet
    (shard,) = tracer.list_trace_files(trace_dir)
    ds = tracer.dataset([shard, GOLDEN])
    expected = tracer.read_spans([shard, GOLDEN], columns=[S.SPAN_ID])[S.SPAN_ID].to_pylist()
    assert sorted(ds.to_table(columns=[S.SPAN_ID])[S.SPAN_ID].to_pylist()) == sorted(expected)
    assert duckdb.sql("select count(*) from ds where step = 7").fetchall() == [(2,)]
    tracer.shutdown()


def test_compact_parquet_is_read_by_duckdbs_own_reader(trace_dir: str) -> None:
    """compact --format parquet writes a step-partitioned dataset; DuckDB's read_parquet sees the same rows."""
    run = _record(trace_dir)
    expected = _expected(run)
    out = os.path.join(trace_dir, "pq")
    assert main(["compact", run, "--format", "parquet", "--out", out]) == 0
    assert sorted(os.listdir(out)) == [f"step={s}" for s in range(3)]
    rows = duckdb.sql(
        f"select {S.STEP}, {S.SPAN_ID} from read_parquet('{out}/**/*.parquet', hive_partitioning=true)"
    ).fetchall()
    assert sorted((int(s), i) for s, i in rows) == expected
    meta = duckdb.sql(f"select distinct compression from parquet_metadata('{out}/**/*.parquet')").fetchall()
    assert meta == [("ZSTD",)]
