"""Shards of writers that ended without closing them are sealed, then compacted; live ones are left alone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pyarrow as pa
import pyarrow.dataset as pds
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_fixtures import span_rows

import tracer
from tracer import schema as S
from tracer.cli import main
from tracer.storage import compact as _compact
from tracer.storage.files import EOS_MARKER, read_batches, read_layout
from tracer.storage.seal import ALREADY_CLOSED, LIVE, NOT_SEALED, SEALED, footer_for, seal_if_abandoned
from tracer.storage.writer import SpanWriter, host_label

#: A worker that records two steps, flushes, and then ends the way ``how`` says.
WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    import tracer

    @tracer.rollout_trace_op(kind="tool")
    def tool(i):
        return i

    out, how, tag = sys.argv[1], sys.argv[2], sys.argv[3]
    tracer.init(output_dir=out)
    for step in range(2):
        for i in range(5):
            with tracer.rollout_trace_attr(sample_index=f"{tag}{i}", step=step):
                tool(i)
    assert tracer.flush().ok
    if how == "exit":
        os._exit(0)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "wait":
        print("flushed", flush=True)
        time.sleep(600)
    """
)


def _worker(out: str, how: str, tag: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, out, how, tag],
        stdout=subprocess.PIPE if how == "wait" else subprocess.DEVNULL,
        text=True,
    )


def _closed(path: str) -> bool:
    reading = read_batches(path)
    list(reading)
    return reading.result.closed


def _span_ids(path: str) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", tracer.TraceFileWarning)
        return sorted(tracer.read_spans(path, columns=[S.SPAN_ID])[S.SPAN_ID].to_pylist())


def test_compact_takes_shards_of_workers_that_ended_without_closing(tmp_path: os.PathLike[str]) -> None:
    """os._exit and SIGKILL after a flush leave open shards; compact seals and merges every one."""
    run = os.path.join(os.fspath(tmp_path), "run")
    procs = [_worker(run, how, how) for how in ("exit", "sigkill", "normal")]
    for p in procs:
        p.wait(timeout=120)
    shards = tracer.list_trace_files(run)
    assert len(shards) == 3
    open_before = [f for f in shards if not _closed(f)]
    assert len(open_before) == 2, "os._exit and SIGKILL skip the writer's close"
    spans = 3 * 2 * 5 * 2
    report = _compact.compact(run)
    assert sorted(report.sealed) == sorted(open_before)
    assert report.files_in == 3 and report.skipped_open == [] and report.set_aside == []
    assert report.rows == spans and len(_span_ids(run)) == spans
    assert [os.path.basename(f).startswith("compacted_") for f in tracer.list_trace_files(run)] == [True]


def test_a_live_writer_keeps_its_shard_until_it_is_gone(tmp_path: os.PathLike[str]) -> None:
    """A writer still running holds its file: compact skips it; once the process is killed, it is sealed."""
    run = os.path.join(os.fspath(tmp_path), "run")
    proc = _worker(run, "wait", "w")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "flushed"
        (shard,) = tracer.list_trace_files(run)
        assert seal_if_abandoned(shard).action == LIVE
        report = _compact.compact(run)
        assert report.files_in == 0 and report.skipped_open == [shard]
        assert len(_span_ids(run)) == 20, "a live shard reads with its flushed batches"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()
    assert _compact.compact(run).sealed == [shard]
    assert len(_span_ids(run)) == 20


def test_readers_seal_a_dead_writers_shard(tmp_path: os.PathLike[str]) -> None:
    """read_spans seals what it reads of a writer that is gone, so engines can open the file afterwards."""
    run = os.path.join(os.fspath(tmp_path), "run")
    _worker(run, "sigkill", "k").wait(timeout=120)
    (shard,) = tracer.list_trace_files(run)
    assert not _closed(shard)
    assert len(_span_ids(run)) == 20
    assert _closed(shard)
    assert pds.dataset(shard, format="ipc").count_rows() == 20


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.integers(1, 40), min_size=0, max_size=6), meta=st.text(max_size=20))
def test_sealing_writes_the_bytes_pyarrow_writes_at_close(
    tmp_path_factory: pytest.TempPathFactory, batches: list[int], meta: str
) -> None:
    """For any batches and metadata, the appended footer is byte for byte the one a clean close writes."""
    run = os.fspath(tmp_path_factory.mktemp("seal"))
    writer = SpanWriter(run, {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION, "rollout_trace.note": meta})
    for b, rows in enumerate(batches):
        writer.write(pa.RecordBatch.from_pylist(span_rows(b, rows), schema=S.SPAN_SCHEMA), {"n": str(b)})
    if writer.path is None:
        return  # nothing written, no file
    path = writer.path
    open_size = os.path.getsize(path)
    writer.close()
    with open(path, "rb") as f:
        closed = f.read()
    cut = path + ".open"
    with open(cut, "wb") as f:
        f.write(closed[:open_size])
    assert closed[open_size:] == footer_for(read_layout(cut))


def test_a_version_1_stream_of_a_dead_process_gets_its_end_marker(tmp_path: os.PathLike[str]) -> None:
    """A stream shard named for a process of this host that no longer runs is closed with its 8 bytes."""
    run = os.path.join(os.fspath(tmp_path), "run")
    os.makedirs(run)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    name = f"{host_label()}_{int(dead.stdout)}_20260101T000000_abcdef01_0000{S.FILE_SUFFIX}"
    path = os.path.join(run, name)
    schema = S.SPAN_SCHEMA.with_metadata({S.META_SCHEMA_VERSION: "1.0"})
    with open(path, "wb") as sink:
        w = pa.ipc.new_stream(sink, schema)
        w.write_batch(pa.RecordBatch.from_pylist(span_rows(0, 3), schema=S.SPAN_SCHEMA))
        sink.flush()
        before = os.path.getsize(path)
        with open(path, "rb") as f:
            body = f.read()
        # no close: like a killed version-1 writer
    with open(path, "wb") as f:
        f.write(body[:before])
    assert seal_if_abandoned(path).action == SEALED
    with open(path, "rb") as f:
        assert f.read() == body[:before] + EOS_MARKER
    assert _closed(path) and seal_if_abandoned(path).action == ALREADY_CLOSED


def test_another_hosts_shard_is_sealed_only_once_quiet_long_enough(tmp_path: os.PathLike[str]) -> None:
    """A shard named for another host: left while younger than the limit, sealed after."""
    run = os.path.join(os.fspath(tmp_path), "run")
    _worker(run, "exit", "h").wait(timeout=120)
    (shard,) = tracer.list_trace_files(run)
    other = os.path.join(run, "elsewhere" + os.path.basename(shard)[len(host_label()) :])
    os.replace(shard, other)
    assert seal_if_abandoned(other, max_age_s=3600).action == LIVE
    old = time.time() - 7200
    os.utime(other, (old, old))
    assert seal_if_abandoned(other, max_age_s=3600).action == SEALED


def test_a_torn_shard_of_a_dead_writer_is_not_sealed(tmp_path: os.PathLike[str]) -> None:
    """A shard cut inside a batch keeps its tear visible: not sealed, set aside by compact, recovered by repair."""
    run = os.path.join(os.fspath(tmp_path), "run")
    _worker(run, "exit", "t").wait(timeout=120)
    (shard,) = tracer.list_trace_files(run)
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:
        f.truncate(size - 5)
    result = seal_if_abandoned(shard)
    assert result.action == NOT_SEALED and "repair" in result.why
    assert os.path.getsize(shard) == size - 5
    report = _compact.compact(run)
    assert report.files_in == 0 and [p for p, _ in report.set_aside] == [shard]


def test_a_writer_whose_file_was_sealed_meanwhile_starts_a_new_one(tmp_path: os.PathLike[str]) -> None:
    """If a quiet writer's file was sealed (another host's rule), its next batch goes to a new file, nothing lost."""
    run = os.fspath(tmp_path)
    writer = SpanWriter(run, {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION})
    writer.write(pa.RecordBatch.from_pylist(span_rows(0, 2, "a"), schema=S.SPAN_SCHEMA))
    first = writer.path
    assert first is not None
    # What a sealer on another host does (flock does not reach across hosts): append the footer.
    with open(first, "ab") as f:
        f.write(footer_for(read_layout(first)))
    writer.write(pa.RecordBatch.from_pylist(span_rows(1, 2, "b"), schema=S.SPAN_SCHEMA))
    writer.close()
    assert writer.path != first and len(writer.paths) == 2
    assert all(_closed(p) for p in writer.paths)
    assert len(_span_ids(run)) == 4


def test_compact_cli_reports_sealed_shards(tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI names each shard it sealed."""
    run = os.path.join(os.fspath(tmp_path), "run")
    _worker(run, "exit", "c").wait(timeout=120)
    assert main(["compact", run]) == 0
    out = capsys.readouterr().out
    assert "sealed" in out and "compacted 1 file(s)" in out
    shutil.rmtree(run)
