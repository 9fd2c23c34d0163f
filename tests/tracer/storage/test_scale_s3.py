"""Object storage: output_dir as a URI; files staged locally, uploaded whole, read back from the URI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from scale_fixtures import REPO, MotoServer, need, run_script

import tracer
from tracer.storage import repair as _repair
from tracer.storage import upload as _upload
from tracer.storage import uri as _uri
from tracer.storage.files import read_layout

pytestmark = pytest.mark.slow


@pytest.fixture()
def staging(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh staging root."""
    root = os.path.join(str(tmp_path), "staging")
    monkeypatch.setenv(_upload.ENV_STAGING_DIR, root)
    return root


def _record(n: int, step: int = 0, prefix: str = "s") -> None:
    @tracer.rollout_trace_op(kind="tool")
    async def calculator(expression: str) -> str:
        return "4"

    @tracer.rollout_trace_op(kind="rollout")
    async def rollout(i: int) -> dict[str, Any]:
        await calculator("2+2")
        return {"messages": []}

    async def main() -> None:
        for i in range(n):
            with tracer.rollout_trace_attr(sample_index=f"{prefix}{i}", step=step):
                await rollout(i)

    asyncio.run(main())


def _staged(staging: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(staging) for f in files if f.endswith(".arrow")]


def _wait_for(predicate: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_files_are_uploaded_when_closed(bucket: str, staging: str) -> None:
    """Nothing reaches the bucket while the file is open; after shutdown every trajectory reads back from s3://."""
    tracer.init(output_dir=bucket, project_name="p", experiment_name="e", upload_interval_s=3600)
    _record(10)
    assert tracer.flush().ok
    with pytest.raises(FileNotFoundError):
        tracer.list_trace_files(f"{bucket}/p/e")
    assert _staged(staging)
    assert tracer.shutdown().ok
    run = f"{bucket}/p/e"
    files = tracer.list_trace_files(run)
    assert len(files) == 1 and files[0].startswith(run + "/") and files[0].endswith(".arrow")
    trajs = tracer.read_trajectories(run)
    assert sorted(trajs.column("sample_index").to_pylist()) == sorted(f"s{i}" for i in range(10))
    assert tracer.read_file_metadata(files[0])["rollout_trace.experiment_name"] == "e"
    assert _staged(staging) == []
    assert not [f for _, _, fs in os.walk(staging) for f in fs if f.endswith(_upload.LOCK_SUFFIX)]


def test_files_rotate_by_age_while_recording(bucket: str, staging: str) -> None:
    """With a short upload_interval_s, closed files reach the bucket while the run goes on."""
    tracer.init(output_dir=bucket, project_name="p", experiment_name="age", upload_interval_s=0.5)
    run = f"{bucket}/p/age"

    def uploaded() -> list[str]:
        try:
            return tracer.list_trace_files(run)
        except FileNotFoundError:
            return []

    _record(3, prefix="a")
    tracer.flush()
    _wait_for(lambda: len(uploaded()) >= 1, "a first upload")
    _record(3, prefix="b")
    tracer.flush()
    _wait_for(lambda: len(uploaded()) >= 2, "a second upload")
    tracer.shutdown()
    names = sorted(tracer.read_trajectories(run).column("sample_index").to_pylist())
    assert names == ["a0", "a1", "a2", "b0", "b1", "b2"]


def test_files_rotate_by_size(bucket: str, staging: str) -> None:
    """max_file_bytes closes a file after each batch that passes it; each is uploaded as its own object."""
    tracer.init(output_dir=bucket, project_name="p", experiment_name="size", max_file_bytes=1)
    for step in range(3):
        _record(2, step=step, prefix=f"x{step}-")
        tracer.flush()
    tracer.shutdown()
    run = f"{bucket}/p/size"
    assert len(tracer.list_trace_files(run)) == 3
    assert tracer.read_trajectories(run).num_rows == 6


def _crash_leaving_staged_files(bucket: str, staging: str, tear: bool) -> None:
    """A subprocess records, flushes, then is killed; optionally a torn batch is appended to its file."""
    run_script(
        f"""
        import asyncio, os, signal, tracer
        tracer.init(output_dir={bucket!r}, project_name="p", experiment_name="crash", upload_interval_s=3600)

        @tracer.rollout_trace_op(kind="rollout")
        async def rollout(i):
            return {{"messages": []}}

        async def main():
            for i in range(5):
                with tracer.rollout_trace_attr(sample_index=f"dead{{i}}", step=0):
                    await rollout(i)

        asyncio.run(main())
        assert tracer.flush().ok
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        env={_upload.ENV_STAGING_DIR: staging},
        expect_killed=True,
    )
    files = _staged(staging)
    assert len(files) == 1
    if tear:
        with open(files[0], "ab") as f:
            f.write(b"\xff\xff\xff\xff\x80\x01\x00\x00half a batch")


def test_next_process_uploads_what_a_crash_left(bucket: str, staging: str) -> None:
    """A process killed mid-run leaves staged files; the next writer with the same URI repairs and uploads them."""
    _crash_leaving_staged_files(bucket, staging, tear=True)
    tracer.init(output_dir=bucket, project_name="p", experiment_name="crash")
    _record(2, prefix="alive")
    tracer.shutdown()
    names = sorted(tracer.read_trajectories(f"{bucket}/p/crash").column("sample_index").to_pylist())
    assert names == ["alive0", "alive1"] + [f"dead{i}" for i in range(5)]
    assert _staged(staging) == []


def test_upload_command_uploads_leftovers(bucket: str, staging: str) -> None:
    """`rollout-trace upload` sends a crashed run's staged files to the URI recorded beside them."""
    _crash_leaving_staged_files(bucket, staging, tear=False)
    exe = os.path.join(os.path.dirname(sys.executable), "rollout-trace")
    proc = subprocess.run([exe, "upload", staging], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("uploaded s3://") == 1
    assert tracer.read_trajectories(f"{bucket}/p/crash").num_rows == 5


def test_live_writer_files_are_left_alone(staging: str, tmp_path: Any) -> None:
    """Files whose writer still holds its lock are not claimed by another process's recovery."""
    run_staging = _upload.staging_dir_for("s3://b/x", staging)
    os.makedirs(run_staging)
    open(os.path.join(run_staging, "h_1_t_n_0000.arrow"), "wb").close()
    open(os.path.join(run_staging, "h_2_t_m_0000.arrow"), "wb").close()
    held = _upload._try_lock(os.path.join(run_staging, "h_1_t_n.lock"))
    assert held is not None
    try:
        files, locks = _upload.claim_orphans(run_staging)
        assert [os.path.basename(f) for f in files] == ["h_2_t_m_0000.arrow"]
        for fd in locks.values():
            os.close(fd)
    finally:
        os.close(held)


def test_other_filesystems_upload_to_a_partial_name_then_rename(staging: str) -> None:
    """A filesystem without atomic PUT (fsspec's memory://) gets the file under a temporary name, then renamed."""
    need("fsspec", "fsspec")
    tracer.init(output_dir="memory://bucket/traces", project_name="p", experiment_name="mem")
    _record(4)
    tracer.shutdown()
    files = tracer.list_trace_files("memory://bucket/traces/p/mem")
    assert len(files) == 1 and _upload.PARTIAL_MARK not in files[0]
    assert tracer.read_trajectories("memory://bucket/traces").num_rows == 4


def test_uri_helpers() -> None:
    """file:// and plain paths are local; join_uri keeps a query string at the end."""
    assert not _uri.is_remote("/tmp/x") and not _uri.is_remote("file:///tmp/x")
    assert _uri.is_remote("s3://b/p") and _uri.is_remote("gs://b")
    assert _uri.join_uri("s3://b/p/?endpoint_override=h", "proj", "exp") == "s3://b/p/proj/exp?endpoint_override=h"


def test_repair_keeps_complete_batches_and_sets_originals_aside(tmp_path: Any) -> None:
    """Repair keeps a torn file's complete batches (read back without warnings); originals are kept as *.damaged."""
    out = os.path.join(str(tmp_path), "local")
    tracer.init(output_dir=out, project_name="p", experiment_name="e")
    _record(2, prefix="first")
    tracer.flush()
    _record(2, prefix="second")
    tracer.shutdown()
    [path] = tracer.list_trace_files(out)
    with open(path, "r+b") as f:
        f.truncate(read_layout(path).batches[-1][0] + 40)  # inside the second batch (footer gone too)
    fixed = _repair.repair_file(path)
    assert fixed.action == _repair.REPAIRED and fixed.kept_batches == 1
    assert sorted(tracer.read_trajectories(fixed.repaired_to).column("sample_index").to_pylist()) == [
        "first0",
        "first1",
    ]
    assert _repair.repair_file(fixed.repaired_to).action == _repair.SOUND
    assert os.path.exists(path + _repair.DAMAGED_SUFFIX) and not os.path.exists(path)
    other = os.path.join(str(tmp_path), "h_2_t_n_0000.arrow")
    with open(other, "wb") as f:
        f.write(b"\xff\xff\xff\xff\x10\x00")  # not even a schema
    fixed = _repair.repair_file(other)
    assert fixed.kept_batches == 0 and not fixed.repaired_to and not os.path.exists(other)


def test_concurrent_processes_share_one_staging_directory(bucket: str, staging: str) -> None:
    """Several processes writing to the same URI on one host each upload their own files; every trajectory once."""
    code = f"""
import asyncio, sys, tracer
tracer.init(output_dir={bucket!r}, project_name="p", experiment_name="many", upload_interval_s=0.3)

@tracer.rollout_trace_op(kind="rollout")
async def rollout(i):
    await asyncio.sleep(0.01)
    return {{"messages": []}}

async def main(worker):
    for i in range(40):
        with tracer.rollout_trace_attr(sample_index=f"w{{worker}}-{{i}}", step=i // 10):
            await rollout(i)
        if i % 10 == 9:
            tracer.flush()

asyncio.run(main(sys.argv[1]))
assert tracer.shutdown().ok
"""
    env = {**os.environ, _upload.ENV_STAGING_DIR: staging, "PYTHONPATH": REPO}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(w)], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
        for w in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    names = tracer.read_trajectories(f"{bucket}/p/many").column("sample_index").to_pylist()
    assert sorted(names) == sorted(f"w{w}-{i}" for w in range(3) for i in range(40))
    assert _staged(staging) == []


def test_compacted_run_reads_from_the_bucket_with_step_pruning(bucket: str, tmp_path: Any) -> None:
    """A run compacted locally and copied to S3 (index included) reads once, by step, from its URI."""
    import pyarrow.fs as pafs

    from tracer.storage.compact import compact

    local = os.path.join(str(tmp_path), "local")
    tracer.init(output_dir=local, max_file_bytes=3000)
    for step in range(3):
        _record(5, step=step, prefix=f"c{step}-")
        tracer.flush()
    tracer.shutdown()
    before = tracer.read_spans(local, columns=["span_id"]).num_rows
    compact(local)
    run = os.path.join(local, "rollout_trace", "default")
    fs, root = _uri.filesystem(bucket)
    for name in os.listdir(run):
        with open(os.path.join(run, name), "rb") as src, fs.open_output_stream(f"{root}/run/{name}") as dst:
            dst.write(src.read())
    uri = f"{bucket}/run"
    assert [os.path.basename(u) for u in tracer.list_trace_files(uri)] == [
        n for n in sorted(os.listdir(run)) if n.endswith(".arrow")
    ]
    assert tracer.read_spans(uri, columns=["span_id"]).num_rows == before
    assert set(tracer.read_spans(uri, columns=["step"], steps=[1])["step"].to_pylist()) == {1}
    assert isinstance(fs, pafs.FileSystem)
