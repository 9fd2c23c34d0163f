"""Compaction on an object store (moto's S3 server) indexes what it writes; Ray Data reads the Parquet output."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from index_fixtures import trace_span, valid_index_of, write_shard
from scale_fixtures import need

import tracer
from tracer import schema as S
from tracer.index.shard import INDEX_SUFFIX, shard_index_path, write_index
from tracer.storage import uri as _uri
from tracer.storage.compact import compact, write_parquet
from tracer.storage.compact_ray import compact_ray
from tracer.storage.index import load_index
from tracer.storage.seal import seal_if_abandoned

pytestmark = pytest.mark.slow


def _run(run: str) -> None:
    """Two workers' shards: one closed by its writer, one of a dead writer; steps 0, 1 and none."""
    write_shard(run, [[trace_span("a", 0, 0), trace_span("a", 1, 0)], [trace_span("b", 0, 1)]])
    dead = write_shard(
        run, [[trace_span("c", 0, 1)], [trace_span("d", 0, None), trace_span("d", 1, None)]], close=False
    )
    seal_if_abandoned(dead, on_sealed=write_index)


def test_compaction_on_s3_uploads_a_valid_index_of_each_output(bucket: str, tmp_path: Any) -> None:
    local = os.fspath(tmp_path / "local")
    _run(local)
    uri = _uri.join_uri(bucket, "run")
    fs, root = _uri.filesystem(uri)
    for name in os.listdir(local):
        if name.endswith(S.FILE_SUFFIX):  # the uploader sends closed shards, without their index
            with open(os.path.join(local, name), "rb") as src, fs.open_output_stream(f"{root}/{name}") as dst:
                dst.write(src.read())
    report = compact(uri, target_bytes=1, delete_after_s=0)
    assert report.files_out == 2 and report.rows == 6
    names = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(root)))
    outputs = sorted(load_index(uri)["files"])
    assert sorted(n for n in names if n.endswith(INDEX_SUFFIX)) == sorted(
        os.path.basename(shard_index_path(o)) for o in outputs
    )
    assert not [n for n in names if n.endswith(".tmp")]
    back = os.fspath(tmp_path / "back")
    os.makedirs(back)
    for name in names:  # what a reader of the bucket would fetch, checked as a local file
        with fs.open_input_stream(f"{root}/{name}") as src, open(os.path.join(back, name), "wb") as dst:
            dst.write(src.read())
    for out in outputs:
        valid_index_of(os.path.join(back, out))


@pytest.fixture(scope="module")
def ray_data() -> Iterator[Any]:
    """One local 1-CPU Ray cluster for the module (Ray Data runs its reads as tasks on it)."""
    need("ray", "ray")
    import ray
    import ray.data

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield ray.data
    finally:
        ray.shutdown()


def test_ray_data_reads_the_parquet_output(ray_data: Any, tmp_path: Any) -> None:
    """``compact --format parquet``'s dataset, loaded by ``ray.data.read_parquet``: the rows ``read_spans`` returns."""
    run = os.fspath(tmp_path / "run")
    _run(run)
    out, rows = write_parquet(run)
    spans = tracer.read_spans(run)
    assert rows == spans.num_rows == 6
    got = pa.concat_tables(ray_data.read_parquet(out).iter_batches(batch_format="pyarrow", batch_size=None))
    # Ray Data takes the step from the Hive partition's directory name, as text; spans without a step
    # sit under Hive's default partition (a typed Partitioning cannot cast that name, so none is asked for).
    assert got.schema.field(S.STEP).type == pa.string()

    def key(t: pa.Table, step: Any = lambda s: s) -> list[tuple[Any, ...]]:
        cols = [
            t.column(S.SPAN_ID).to_pylist(),
            t.column(S.TRACE_ID).to_pylist(),
            map(step, t.column(S.STEP).to_pylist()),
        ]
        return sorted(zip(*cols, strict=True))

    assert got.num_rows == spans.num_rows
    assert key(got) == key(spans, lambda s: "__HIVE_DEFAULT_PARTITION__" if s is None else str(s))


def test_ray_merges_of_a_local_run_are_indexed(ray_data: Any, tmp_path: Any) -> None:
    """``compact --ray`` on a shared filesystem: each task's merge comes back, the driver indexes the renamed file."""
    run = os.fspath(tmp_path / "run")
    _run(run)
    write_shard(run, [[trace_span("e", 0, 2)]], close=False)  # sealed by the compaction's plan
    before = tracer.read_spans(run).sort_by(S.SPAN_ID)
    report = compact_ray(run, target_bytes=1)
    assert report.files_out == 3 and not report.failed
    outputs = sorted(load_index(run)["files"])
    for out in outputs:
        valid_index_of(os.path.join(run, out))
    assert sorted(n for n in os.listdir(run) if n.endswith(INDEX_SUFFIX)) == sorted(
        os.path.basename(shard_index_path(o)) for o in outputs
    )
    assert tracer.read_spans(run).sort_by(S.SPAN_ID).equals(before)
