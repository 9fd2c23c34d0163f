"""`rollout-trace compact --ray`: merges as Ray tasks on a local cluster, reading and writing moto's S3 server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.fs as pafs
import pytest
from scale_fixtures import REPO, MotoServer, need

import tracer
from tracer import schema as S
from tracer.cli import main
from tracer.storage import uri as _uri
from tracer.storage.compact import PARQUET_DONE, MergeResult, MergeUnit, merge_unit
from tracer.storage.compact_ray import compact_ray
from tracer.storage.files import ends_closed
from tracer.storage.index import INDEX_NAME
from tracer.storage.upload import ENV_STAGING_DIR

pytestmark = pytest.mark.slow

TESTS_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORKERS = 2
STEPS = 2


@pytest.fixture(scope="module")
def ray_cluster(s3: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local 2-CPU Ray cluster for the module; its workers reach the moto server and import this module."""
    need("ray", "ray")
    import ray

    staging = str(tmp_path_factory.mktemp("staging"))
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "env_vars": {
                **s3.env(),
                ENV_STAGING_DIR: staging,
                "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), TESTS_DIR, REPO]),
            }
        },
    )
    try:
        yield ray
    finally:
        ray.shutdown()


def _record_worker(run_root: str, worker: int, die: bool = False) -> None:
    """One worker of a run: STEPS steps of 3 trajectories, each flushed into its own file (object on S3).

    With ``die``, the worker process ends by ``os._exit`` after its last flush, as Ray workers do at
    ``ray.shutdown()``: its last shard never gets its footer.
    """

    @tracer.rollout_trace_op(kind="tool")
    def calculator(i: int) -> int:
        return i

    @tracer.rollout_trace_op(kind="rollout")
    def rollout(i: int) -> int:
        return calculator(i)

    # A dying worker keeps one open file; the others close (and upload) one per flush.
    rotate = {} if die else {"max_file_bytes": 1}
    tracer.init(output_dir=run_root, project_name="p", experiment_name="e", **rotate)
    for step in range(STEPS):
        for i in range(3):
            with tracer.rollout_trace_attr(sample_index=f"w{worker}-{i}", step=step):
                rollout(i)
        assert tracer.flush().ok
    if die:
        os._exit(0)
    assert tracer.shutdown().ok


def _recorded_run(ray: Any, bucket: str) -> str:
    """A multi-step run of WORKERS Ray tasks recording into ``bucket``; returns the run's URI."""
    ray.get([ray.remote(_record_worker).remote(bucket, w) for w in range(WORKERS)])
    run = f"{bucket}/p/e"
    assert len(tracer.list_trace_files(run)) == WORKERS * STEPS
    return run


def _rows(path: str) -> pa.Table:
    return tracer.read_spans(path).sort_by(S.SPAN_ID)


def _objects(uri: str) -> list[str]:
    fs, root = _uri.filesystem(uri)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return sorted(i.path[len(root) + 1 :] for i in infos if i.type == pafs.FileType.File)


def _merge_then_die(unit: MergeUnit) -> MergeResult:
    """The real merge, whose ``.tmp`` is written in full; then the worker dies before the driver hears back."""
    merge_unit(unit)
    os._exit(1)


def test_a_killed_task_changes_nothing_and_a_rerun_merges_the_bucket(
    ray_cluster: Any, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A merge whose worker dies leaves every input and no index; `compact URI --ray` then merges it all.

    The re-run (the CLI, several tasks, Parquet too) reads back every span once, by step as well.
    """
    run = _recorded_run(ray_cluster, bucket)
    before, objects = _rows(run), _objects(run)
    report = compact_ray(bucket, delete_after_s=0, retries=0, merge=_merge_then_die)
    assert report.files_out == 0 and len(report.failed) == 1
    assert report.failed[0][0] == run and f"merge of {WORKERS * STEPS} file(s)" in report.failed[0][1]
    assert _objects(run) == objects  # no index, no leftover .tmp, every input
    assert _rows(run).equals(before)

    size_mb = sum(_uri.file_size(f) for f in tracer.list_trace_files(run)) / 1024 / 1024
    args = ["compact", bucket, "--ray", "--target-mb", f"{size_mb / 2:.6f}", "--delete-after", "0"]
    assert main([*args, "--format", "parquet"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    merged = tracer.list_trace_files(run)
    assert f"compacted {WORKERS * STEPS} file(s) in 1 run dir(s) into {len(merged)}" in out and len(merged) >= 2
    assert all("compacted_" in f for f in merged)
    # Originals deleted; each compacted file has its shard index (_compacted_*.arrow.index) beside it.
    assert [n for n in _objects(run) if not n.lstrip("_").startswith("compacted_")] == [INDEX_NAME]
    assert len([n for n in _objects(run) if n.startswith("_compacted_")]) == len(merged)
    assert _rows(run).equals(before)
    one_step = tracer.read_spans(run, columns=[S.SPAN_ID, S.STEP], steps=[1])
    assert one_step.column(S.SPAN_ID).to_pylist() and set(one_step.column(S.STEP).to_pylist()) == {1}
    fs, root = _uri.filesystem(f"{bucket}/parquet")
    parquet = pds.dataset(root, filesystem=fs, format="parquet", partitioning="hive").to_table()
    assert sorted(parquet.column(S.SPAN_ID).to_pylist()) == before.column(S.SPAN_ID).to_pylist()
    assert PARQUET_DONE in _objects(f"{bucket}/parquet")


def test_a_local_run_with_a_dead_writer_compacts_with_ray(ray_cluster: Any, tmp_path: Any) -> None:
    """On a path the workers share, the shard of a worker that died unclosed is sealed and merged with the rest."""
    ray = ray_cluster
    root = str(tmp_path)
    ray.get([ray.remote(_record_worker).remote(root, w) for w in range(2)])
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray.get(ray.remote(max_retries=0)(_record_worker).remote(root, 2, True))
    run = os.path.join(root, "p", "e")
    assert len([f for f in tracer.list_trace_files(run) if not ends_closed(f)]) == 1
    report = compact_ray(run)  # seals it (readers would too), then merges
    assert len(report.sealed) == 1 and report.failed == [] and report.files_in == 2 * STEPS + 1
    assert report.rows == 3 * STEPS * 3 * 2
    rows = _rows(run)
    assert rows.num_rows == report.rows and len(set(rows.column(S.SPAN_ID).to_pylist())) == report.rows
    assert [os.path.basename(f).startswith("compacted_") for f in tracer.list_trace_files(run)] == [True]
