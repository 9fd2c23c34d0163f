"""`rollout-trace check`: damage is found and reported, --repair keeps every readable span and every original."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import tracer
from tracer.cli import main
from tracer.storage.files import read_layout


@tracer.rollout_trace_op(kind="tool")
def tool(i: int) -> int:
    return i


def make_run(trace_dir: str, batches: int = 3) -> str:
    tracer.init(output_dir=trace_dir)
    for b in range(batches):
        for i in range(10):
            with tracer.rollout_trace_attr(sample_index=f"{b}-{i}", step=b):
                tool(i)
        tracer.flush()
    tracer.shutdown()
    (path,) = tracer.list_trace_files(trace_dir)
    return path


def test_clean_run_passes(trace_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A clean directory exits 0 and says OK with the counts."""
    make_run(trace_dir)
    assert main(["check", trace_dir]) == 0
    out = capsys.readouterr().out
    assert "OK: 1 file(s), 0 damaged, 60 span(s), 30 trajectories" in out


def test_damage_is_found_and_repair_keeps_readable_data_and_originals(
    trace_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Torn, empty and garbage files exit 1; --repair rewrites what is readable and keeps originals aside."""
    path = make_run(trace_dir)
    run = os.path.dirname(path)
    torn = os.path.join(run, "torn.arrow")
    shutil.copy(path, torn)
    cut = read_layout(path).batches[-1][0] + 100  # inside the last batch
    with open(torn, "r+b") as f:
        f.truncate(cut)
    open(os.path.join(run, "empty.arrow"), "wb").close()
    with open(os.path.join(run, "garbage.arrow"), "wb") as f:
        f.write(b"not arrow at all" * 100)
    assert main(["check", trace_dir]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED  rollout_trace/default/torn.arrow: torn after 2 complete batch(es), 40 span(s) readable" in out
    assert "empty.arrow: empty file" in out and "garbage.arrow" in out and "--repair" in out
    assert "duplicate" in out  # the torn copy repeats spans of the original

    assert main(["check", trace_dir, "--repair"]) == 0
    names = sorted(os.listdir(run))
    assert "torn.repaired.arrow" in names and "torn.arrow.damaged" in names
    assert "empty.arrow.damaged" in names and "garbage.arrow.damaged" in names
    assert os.path.getsize(os.path.join(run, "torn.arrow.damaged")) == cut
    assert tracer.read_spans(os.path.join(run, "torn.repaired.arrow")).num_rows == 40


def test_duplicates_fail_and_orphans_are_reported(trace_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A copied file duplicates spans (exit 1); spans whose parent was never written count as orphans."""
    path = make_run(trace_dir, batches=1)
    shutil.copy(path, path.replace(".arrow", "_copy.arrow"))
    assert main(["check", trace_dir, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["duplicate_spans"] == 20 and not report["ok"]

    other = os.path.join(trace_dir, "orphans")
    tracer.init(output_dir=other)
    with tracer.rollout_trace_attr(sample_index=0, step=0):
        tool(1)
        tracer.flush()  # the child is durable; the root never will be
        assert main(["check", other, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["orphan_spans"] == 1 and report["ok"]


def test_missing_path_exits_2(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    """check on a path that does not exist says so and exits 2."""
    assert main(["check", os.path.join(str(tmp_path), "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
