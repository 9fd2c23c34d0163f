"""Files: round trip, layout, metadata, rotation, damage, kill -9, buffer limits, the golden file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pyarrow as pa
import pytest

import tracer
from tracer.storage.files import read_batches, read_layout

GOLDEN_DIR = os.path.join(
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")), "sample_data", "golden"
)
#: One golden file per major format version, each read forever (tests/make_golden.py writes the current one).
GOLDEN_FILES = {1: os.path.join(GOLDEN_DIR, "trace_v1.arrow"), 2: os.path.join(GOLDEN_DIR, "trace_v2.arrow")}


@tracer.rollout_trace_op(kind="tool")
def tool(i: int, text: str) -> str:
    return text.upper()


def record(n: int) -> None:
    for i in range(n):
        with tracer.rollout_trace_attr(sample_index=i, step=i % 3, rollout_n=0):
            tool(i, f"payload {i} " * 20)


def test_round_trip_layout_and_metadata(trace_dir: str) -> None:
    """Spans come back with every column; files sit under output_dir/project/experiment with metadata."""
    tracer.init(output_dir=trace_dir, project_name="proj", experiment_name="exp", token2text=False)
    record(10)
    assert tracer.flush().ok
    files = tracer.list_trace_files(trace_dir)
    assert len(files) == 1 and os.path.dirname(files[0]) == os.path.join(trace_dir, "proj", "exp")
    name = os.path.basename(files[0])
    assert name.endswith(".arrow") and f"_{os.getpid()}_" in name
    meta = tracer.read_file_metadata(files[0])
    assert meta["rollout_trace.schema_version"] == tracer.schema.SCHEMA_VERSION
    assert json.loads(meta["rollout_trace.config"])["experiment_name"] == "exp"
    table = tracer.read_spans(trace_dir)
    assert table.schema == tracer.schema.SPAN_SCHEMA and table.num_rows == 20
    tools = [r for r in table.to_pylist() if r["kind"] == "tool"]
    assert sorted(json.loads(r["outputs"]) for r in tools)[0] == ("PAYLOAD 0 " * 20)
    projected = tracer.read_spans(trace_dir, columns=["name", "step"], steps=[1, 2])
    assert projected.column_names == ["name", "step"] and set(projected["step"].to_pylist()) == {1, 2}


def test_files_are_zstd_compressed(trace_dir: str) -> None:
    """Buffers in the file are zstd-compressed: repetitive payloads shrink well below their size."""
    tracer.init(output_dir=trace_dir)
    record(500)
    tracer.flush()
    raw = tracer.read_spans(trace_dir).nbytes
    on_disk = sum(os.path.getsize(f) for f in tracer.list_trace_files(trace_dir))
    assert on_disk * 4 < raw


def test_rotation_by_size_keeps_every_span(trace_dir: str) -> None:
    """A small max_file_bytes rotates into several files, all read back."""
    tracer.init(output_dir=trace_dir, max_file_bytes=2000)
    for _ in range(5):
        record(20)
        tracer.flush()
    assert len(tracer.list_trace_files(trace_dir)) >= 3
    assert tracer.read_spans(trace_dir, columns=["span_id"]).num_rows == 200


def test_damaged_files_are_read_up_to_the_damage_with_a_warning(trace_dir: str) -> None:
    """Truncated, empty and garbage files warn and are skipped or read to their last whole batch."""
    tracer.init(output_dir=trace_dir, max_file_bytes=10**9)
    for _ in range(3):
        record(10)
        tracer.flush()
    tracer.shutdown()
    (path,) = tracer.list_trace_files(trace_dir)
    with open(path, "r+b") as f:
        f.truncate(read_layout(path).batches[-1][0] + 40)  # tear the last batch (and so the footer)
    run = os.path.dirname(path)
    open(os.path.join(run, "empty.arrow"), "wb").close()
    with open(os.path.join(run, "garbage.arrow"), "wb") as f:
        f.write(os.urandom(5000))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = tracer.read_spans(trace_dir)
        trajectories = tracer.read_trajectories(trace_dir)
    assert table.num_rows == 40 and trajectories.num_rows == 20
    messages = " | ".join(str(w.message) for w in caught if issubclass(w.category, tracer.TraceFileWarning))
    assert "recovered 40 span(s)" in messages and "empty file" in messages and "garbage.arrow" in messages


def test_kill_dash_9_loses_nothing_that_flush_acknowledged(tmp_path: object) -> None:
    """A writer killed with SIGKILL mid-recording: every span acknowledged by flush() is read back."""
    out = os.path.join(str(tmp_path), "traces")
    script = textwrap.dedent(f"""
        import sys, tracer
        tracer.init(output_dir={out!r}, flush_interval_s=0.05)
        @tracer.rollout_trace_op(kind="tool")
        def tool(i): return i
        i = 0
        while True:
            for _ in range(50):
                with tracer.rollout_trace_attr(sample_index=i, step=0):
                    tool(i)
                i += 1
            if i % 500 == 0:
                assert tracer.flush().ok
                print(i, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    acknowledged = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        acknowledged = int(line)
        if acknowledged >= 3000:
            break
    time.sleep(0.2)  # keep writing past the acknowledgement
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        trajectories = tracer.read_trajectories(out)
    indices = {int(s) for s in trajectories["sample_index"].to_pylist()}
    assert set(range(acknowledged)) <= indices


def test_full_buffer_blocks_by_default_and_loses_nothing(trace_dir: str) -> None:
    """on_buffer_full='block' with a tiny buffer: callers wait for the writer; every span is written."""
    tracer.init(output_dir=trace_dir, max_buffered_spans=8)
    record(300)
    result = tracer.flush()
    assert result.ok and result.spans_dropped == 0
    assert tracer.read_spans(trace_dir, columns=["span_id"]).num_rows == 600


def test_full_buffer_in_drop_mode_counts_every_drop(trace_dir: str) -> None:
    """on_buffer_full='drop': written + dropped == recorded, and the count is in the file metadata."""
    tracer.init(output_dir=trace_dir, max_buffered_spans=4, on_buffer_full="drop")
    record(2000)
    result = tracer.flush()
    written = tracer.read_spans(trace_dir, columns=["span_id"]).num_rows
    assert written + result.spans_dropped == 4000 and result.spans_written == written
    if result.spans_dropped:
        assert not result.ok and "dropped" in result.message
    last = list(read_batches(tracer.list_trace_files(trace_dir)[0]).with_metadata())[-1]
    assert last is not None and "rollout_trace.spans_dropped" in {k.decode() for k in last[1]}


@pytest.mark.parametrize("version", sorted(GOLDEN_FILES))
def test_golden_file_still_reads(version: int) -> None:
    """Each committed golden file reads with today's readers: a format change that breaks one fails here."""
    golden = GOLDEN_FILES[version]
    meta = tracer.read_file_metadata(golden)
    assert meta["rollout_trace.schema_version"] == f"{version}.0"
    table = tracer.read_spans(golden)
    assert table.num_rows == 8  # 2 trajectories: root, generate, calculator, reward
    trajectories = tracer.read_trajectories(golden).to_pylist()
    assert [(t["rollout_n"], t["reward"], t["status"], t["num_tool_errors"]) for t in trajectories] == [
        (0, 1.0, "ok", 0),
        (1, 0.0, "ok", 1),
    ]
    assert json.loads(trajectories[1]["reward_info"]) == {"advantage": -0.5}
    rows = {(r["name"], r["rollout_n"]): r for r in table.to_pylist()}
    assert json.loads(rows[("generate", 0)]["inputs"]) == {"prompt_ids": [1, 2, 3]}
    assert json.loads(rows[("calculator", 1)]["error"])["type"] == "ZeroDivisionError"
    assert tracer.trajectory_messages([r for r in table.to_pylist() if r["rollout_n"] == 0])[0] == {
        "role": "user",
        "content": "What is 2+2?",
    }


def test_missing_path_is_a_clear_error(tmp_path: object) -> None:
    """Reading a path that does not exist raises FileNotFoundError naming it."""
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tracer.read_spans(os.path.join(str(tmp_path), "nope"))
