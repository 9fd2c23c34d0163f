"""Compaction merges only what it read completely, keeps every other file byte for byte, and never hides a span from a reader."""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from collections.abc import Callable

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from tracer import schema as S
from tracer.storage.compact import compact

#: Kinds of file a run directory may hold beside good ones, and whether compaction may merge them.
#: A newer minor version of today's major: readers take it.
MINOR_NEWER = f"{S.SCHEMA_VERSION.split('.')[0]}.99"
KINDS = ("good", "open", "torn", "rotten", "foreign", "newer", "minor_newer", "wrong_type", "empty", "fifo")
MERGEABLE = {"good", "minor_newer"}


def _make(run: str, name: str, kind: str, write_trace: Callable[..., list[list[str]]]) -> None:
    path = os.path.join(run, name)
    if kind in ("good", "open", "torn", "rotten"):
        write_trace(path, 3, close=kind != "open")
        if kind == "torn":
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) - 60)
        if kind == "rotten":  # bit rot inside the last batch's body, end marker intact
            with open(path, "r+b") as f:
                f.seek(os.path.getsize(path) - 120)
                f.write(b"\x00" * 40)
    elif kind == "minor_newer":
        write_trace(path, 2, metadata={S.META_SCHEMA_VERSION: MINOR_NEWER})
    elif kind == "newer":
        write_trace(path, 2, metadata={S.META_SCHEMA_VERSION: "99.0"})
    elif kind == "foreign":
        table = pa.table({"x": [1, 2, 3]})
        with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table)
    elif kind == "wrong_type":
        fields = [pa.field(f.name, pa.string() if f.name == S.STEP else f.type) for f in tracer.schema.SPAN_SCHEMA]
        schema = pa.schema(fields, metadata={S.META_SCHEMA_VERSION: S.SCHEMA_VERSION})
        with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, schema) as w:
            w.write_batch(
                pa.RecordBatch.from_pylist([{S.TRACE_ID: "w", S.SPAN_ID: "w1", S.STEP: "one"}], schema=schema)
            )
    elif kind == "empty":
        open(path, "wb").close()
    elif kind == "fifo":
        os.mkfifo(path)


def _digest(path: str) -> str:
    if not os.path.isfile(path):
        return "special"
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _ids(run: str) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tracer.TraceFileWarning)
        return sorted(tracer.read_spans(run, columns=[S.SPAN_ID])[S.SPAN_ID].to_pylist())


def _compact_with_deadline(run: str) -> object:
    """Run compaction in a thread; a hang (a FIFO opened for reading) fails instead of blocking the suite."""
    out: dict[str, object] = {}
    thread = threading.Thread(target=lambda: out.setdefault("report", compact(run)), daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "compaction hung"
    return out["report"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
def test_compaction_merges_only_complete_files_and_keeps_the_rest_untouched(
    tmp_path_factory: pytest.TempPathFactory, write_trace: Callable[..., list[list[str]]], kinds: list[str]
) -> None:
    """Any mix of good, open, torn, rotten, foreign, newer, mistyped, empty and FIFO files: no span lost, the rest kept byte for byte."""
    run = str(tmp_path_factory.mktemp("mix"))
    for i, kind in enumerate(kinds):
        _make(run, f"{i:02d}_{kind}.arrow", kind, write_trace)
    before = {n: _digest(os.path.join(run, n)) for n in os.listdir(run) if n.endswith(".arrow")}  # trace files
    spans_before = _ids(run)
    report = _compact_with_deadline(run)
    assert _ids(run) == spans_before, "readers see the same spans after compaction"
    merged = {os.path.basename(n) for n in before if n.split("_", 1)[1][: -len(".arrow")] in MERGEABLE}
    left = sorted(n for n in os.listdir(run) if n.endswith(".arrow") and not n.startswith("compacted_"))
    assert left == sorted(set(before) - merged), "only complete files were merged"
    for name in left:
        assert _digest(os.path.join(run, name)) == before[name], f"{name} was changed"
    named = {os.path.basename(p) for p, _ in report.set_aside} | {os.path.basename(p) for p in report.skipped_open}  # type: ignore[attr-defined]
    assert named == set(left), "the report names every file it did not merge"


def test_merged_metadata_keeps_the_merged_file_readable(
    tmp_path: os.PathLike[str], write_trace: Callable[..., list[list[str]]]
) -> None:
    """Inputs with differing metadata (a newer minor version first): the merged file has this tool's version and every span."""
    run = os.fspath(tmp_path)
    write_trace(
        os.path.join(run, "a.arrow"), 50, metadata={S.META_SCHEMA_VERSION: MINOR_NEWER, "rollout_trace.host": "a"}
    )
    write_trace(
        os.path.join(run, "b.arrow"), 50, metadata={"rollout_trace.host": "b", "rollout_trace.project_name": "p"}
    )
    assert len(_ids(run)) == 200
    compact(run)
    (merged,) = tracer.list_trace_files(run)
    meta = tracer.read_file_metadata(merged)
    assert meta[S.META_SCHEMA_VERSION] == S.SCHEMA_VERSION and "rollout_trace.host" not in meta
    assert len(_ids(run)) == 200


def test_a_fifo_named_like_a_trace_file_hangs_neither_compaction_nor_readers(
    tmp_path: os.PathLike[str], write_trace: Callable[..., list[list[str]]]
) -> None:
    """A FIFO x.arrow is set aside by compaction and skipped by readers with a warning, without being opened."""
    run = os.fspath(tmp_path)
    write_trace(os.path.join(run, "a.arrow"), 2)
    os.mkfifo(os.path.join(run, "x.arrow"))
    report = _compact_with_deadline(run)
    assert [os.path.basename(p) for p, _ in report.set_aside] == ["x.arrow"]  # type: ignore[attr-defined]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tracer.read_spans(run).num_rows == 4
    assert any("x.arrow" in str(w.message) and "not a regular file" in str(w.message) for w in caught)


@pytest.mark.slow
def test_readers_during_compaction_see_every_span_exactly_once(
    tmp_path: os.PathLike[str], write_trace: Callable[..., list[list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three reader threads read in a loop while compactions run: every read returns every span once, with no warning."""
    from tracer.storage import compact as _compact

    monkeypatch.setattr(_compact, "DELETE_WAIT_S", 0.5)  # readers never pause here: deletion is left to the last run
    reads = 0
    for trial in range(4):
        run = os.path.join(os.fspath(tmp_path), f"trial{trial}")
        os.makedirs(run)
        expected = sorted(
            s for i in range(30) for batch in write_trace(os.path.join(run, f"shard{i:03d}.arrow"), 2) for s in batch
        )
        done = threading.Event()
        bad: list[str] = []
        counts = [0, 0, 0]

        def read_loop(
            k: int,
            run: str = run,
            expected: list[str] = expected,
            done: threading.Event = done,
            counts: list[int] = counts,
            bad: list[str] = bad,
        ) -> None:
            while not done.is_set() or counts[k] == 0:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    got = sorted(tracer.read_spans(run, columns=[S.SPAN_ID])[S.SPAN_ID].to_pylist())
                counts[k] += 1
                if got != expected or caught:
                    bad.append(f"{len(got)} of {len(expected)} spans; {[str(w.message) for w in caught]}")

        threads = [threading.Thread(target=read_loop, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        compact(run, target_bytes=20_000)  # several merged files, one after another
        done.set()
        for t in threads:
            t.join()
        compact(run)  # deletes what readers held back
        reads += sum(counts)
        assert not bad, bad[:3]
        assert _ids(run) == expected
        assert all(n.startswith("compacted_") for n in os.listdir(run) if n.endswith(".arrow"))
    assert reads > 0
