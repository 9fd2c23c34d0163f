"""`rollout-trace compact`: every row exactly once, step pruning, open files left alone, crash-safe at every step."""

from __future__ import annotations

import os

import pytest

import tracer
from tracer.cli import main
from tracer.storage import compact as _compact


@tracer.rollout_trace_op(kind="tool")
def tool(i: int) -> int:
    return i


def make_shards(trace_dir: str, steps: int = 4, per_step: int = 25) -> int:
    """Record several steps into many small closed files; return the span count."""
    tracer.init(output_dir=trace_dir, max_file_bytes=2500)
    for step in range(steps):
        for i in range(per_step):
            with tracer.rollout_trace_attr(sample_index=i, step=step, rollout_n=i % 4):
                tool(i)
        tracer.flush()
    tracer.shutdown()
    return steps * per_step * 2


def span_ids(trace_dir: str) -> list[str]:
    return sorted(tracer.read_spans(trace_dir, columns=["span_id"])["span_id"].to_pylist())


def test_compaction_keeps_every_row_once_and_indexes_steps(trace_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Many shards become one step-indexed file; rows, trajectories and rewards are unchanged."""
    total = make_shards(trace_dir)
    before = span_ids(trace_dir)
    trajectories = tracer.read_trajectories(trace_dir)
    assert len(tracer.list_trace_files(trace_dir)) > 3 and len(before) == total
    assert main(["compact", trace_dir]) == 0
    assert "into 1:" in capsys.readouterr().out
    files = tracer.list_trace_files(trace_dir)
    assert len(files) == 1 and os.path.basename(files[0]).startswith("compacted_")
    assert span_ids(trace_dir) == before
    assert tracer.read_trajectories(trace_dir).sort_by("trace_id").equals(trajectories.sort_by("trace_id"))
    read = [b for _, b in tracer.iter_batches(trace_dir, ["step"], steps=[2])]
    assert read and all(set(b.column(0).to_pylist()) == {2} for b in read)
    assert tracer.read_spans(trace_dir, steps=[2]).num_rows == total // 4
    assert main(["check", trace_dir]) == 0


def test_open_files_are_left_alone(trace_dir: str) -> None:
    """A file still being written (no end-of-stream marker) is not compacted."""
    tracer.init(output_dir=trace_dir)
    with tracer.rollout_trace_attr(sample_index=0, step=0):
        tool(1)
    tracer.flush()
    report = _compact.compact(trace_dir)
    assert report.files_in == 0 and len(report.skipped_open) == 1
    tracer.shutdown()
    assert _compact.compact(trace_dir).files_in == 1


@pytest.mark.parametrize("crash_at", [1, 2, 3, 4])
def test_a_crash_at_any_step_loses_and_duplicates_nothing(
    trace_dir: str, monkeypatch: pytest.MonkeyPatch, crash_at: int
) -> None:
    """Stop compaction at its n-th rename or delete: readers see every row once; the next run finishes the job."""
    make_shards(trace_dir, steps=2)
    before = span_ids(trace_dir)
    calls = {"n": 0}
    real_replace, real_remove = os.replace, os.remove

    class Crash(BaseException):
        pass

    def counting(real):  # type: ignore[no-untyped-def]
        def op(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] == crash_at:
                raise Crash()
            return real(*args, **kwargs)

        return op

    monkeypatch.setattr(_compact.os, "replace", counting(real_replace))
    monkeypatch.setattr(_compact.os, "remove", counting(real_remove))
    with pytest.raises(Crash):
        _compact.compact(trace_dir)
    monkeypatch.undo()
    assert span_ids(trace_dir) == before
    _compact.compact(trace_dir)
    assert span_ids(trace_dir) == before
    assert len(tracer.list_trace_files(trace_dir)) == 1


def test_compact_bad_path_exits_2(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    """compact on a missing path says so and exits 2."""
    assert main(["compact", os.path.join(str(tmp_path), "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
