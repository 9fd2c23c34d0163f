"""Decompression bombs: every reader refuses a batch whose declared size would blow memory up, and says what it refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pyarrow as pa
import pytest

import tracer
from tracer import schema as S
from tracer.storage.check import check_path
from tracer.storage.files import MIN_BUDGET_BYTES

BOMB_BYTES = 300 * 1024 * 1024
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _write_bomb(path: str, column: str, bomb_at: int) -> None:
    """Three small batches, and at ``bomb_at`` one whose ``column`` holds 300 MB of one letter (a few KB zstd'd)."""
    schema = tracer.schema.SPAN_SCHEMA.with_metadata({S.META_SCHEMA_VERSION: S.SCHEMA_VERSION})
    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", 3))
    with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, schema, options=options) as w:
        for b in range(4):
            row = {S.TRACE_ID: f"t{b}", S.SPAN_ID: f"s{b}", S.NAME: "x", S.KIND: "tool", S.STATUS: "ok"}
            row[S.START_NS] = row[S.END_NS] = 1
            if b == bomb_at:
                row[column] = "a" * BOMB_BYTES
            w.write_batch(pa.RecordBatch.from_pylist([row], schema=schema))


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A trace file of a few KB whose second batch decompresses to 300 MB."""
    path = os.path.join(str(tmp_path_factory.mktemp("bomb")), "bomb.arrow")
    _write_bomb(path, S.INPUTS, 1)
    assert os.path.getsize(path) < 100_000
    return path


def test_readers_refuse_the_bomb_and_keep_what_comes_before(bomb: str) -> None:
    """read_spans keeps the batch before the bomb and warns naming the batch, its declared size and the budget."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = tracer.read_spans(bomb)
    assert table[S.SPAN_ID].to_pylist() == ["s0"]
    (message,) = [str(w.message) for w in caught]
    assert "refused batch 1 and the 2 batch(es) after it" in message and "314.6 MB" in message
    assert "ROLLOUT_TRACE_MAX_EXPANSION" in message and "kept 1 batch(es), 1 span(s)" in message


def test_projection_reads_past_the_bomb_when_its_column_is_not_asked_for(bomb: str) -> None:
    """The budget counts only the columns read: span ids of every batch come back."""
    assert tracer.read_spans(bomb, columns=[S.SPAN_ID])[S.SPAN_ID].to_pylist() == ["s0", "s1", "s2", "s3"]


def test_check_reports_the_refusal_as_damage(bomb: str) -> None:
    """check does not say OK for a bomb, and names the refusal."""
    report = check_path(bomb)
    assert not report.ok and "refused batch 1" in report.files[0].damage


def test_raising_the_budget_reads_a_genuine_file(bomb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ROLLOUT_TRACE_MAX_EXPANSION raised, the same file reads whole."""
    monkeypatch.setenv("ROLLOUT_TRACE_MAX_EXPANSION", "1000000")
    assert tracer.read_spans(bomb, columns=[S.SPAN_ID, S.INPUTS]).num_rows == 4


@pytest.mark.slow
def test_info_check_and_readers_stay_within_the_budget(bomb: str) -> None:
    """In a fresh process, info, check and the readers over the bomb stay far below what it declares.

    VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec.
    """
    code = f"""
import json, warnings, pyarrow as pa, tracer
from tracer.cli import main
from tracer.storage.check import check_path
warnings.simplefilter("ignore")
path = {bomb!r}
main(["info", path]); check_path(path); tracer.read_spans(path); tracer.read_trajectories(path)
print(json.dumps({{"arrow_peak": pa.default_memory_pool().max_memory(),
                  "rss_kb": int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["arrow_peak"] < MIN_BUDGET_BYTES, figures
    assert figures["rss_kb"] * 1024 < BOMB_BYTES, figures
