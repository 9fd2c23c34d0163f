"""Every closed shard has its index: shards sealed for a dead writer, and the files compaction writes."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_fixtures import bare_copy, trace_span, valid_index_of, write_shard
from storage_fixtures import temporaries

import tracer
from tracer import schema as S
from tracer.index import shard as _si
from tracer.index.closed import shard_closed
from tracer.index.readers import read_trajectories
from tracer.index.shard import INDEX_SUFFIX, load_shard_index, shard_index_path, write_index
from tracer.read import read_steps
from tracer.storage.compact import compact
from tracer.storage.files import read_layout
from tracer.storage.index import load_index
from tracer.storage.seal import ALREADY_CLOSED, SEALED, seal_if_abandoned
from tracer.storage.writer import SpanWriter
from tracer.summary import SUMMARY_SPAN_COLUMNS, step_partials, summarize

pytestmark = pytest.mark.usefixtures("shard_indexes_alone")  # the indexes' own answers, not the rollup's

META = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION}


def _three_batches(run: str) -> str:
    return write_shard(
        run,
        [
            [trace_span("a", 0, 1), trace_span("a", 1, 1)],
            [trace_span("b", 0, 2), trace_span("b", 1, 2)],
            [trace_span("c", 0, 3)],
        ],
        close=False,
    )


def _same_reads(run: str, bare: str, trace_ids: list[str], steps: list[int]) -> None:
    """Every reader returns the same rows from ``run`` as from ``bare`` (in any file order)."""

    def trajectories(path: str, **kw: Any) -> pa.Table:
        return read_trajectories(path, **kw).sort_by(S.TRACE_ID).combine_chunks()

    def spans(path: str, **kw: Any) -> pa.Table:
        return tracer.read_spans(path, **kw).sort_by(S.SPAN_ID).combine_chunks()

    assert trajectories(run).equals(trajectories(bare))
    for step in steps:
        assert trajectories(run, steps=[step]).equals(trajectories(bare, steps=[step]))
        assert spans(run, steps=step).equals(spans(bare, steps=step))
    for tid in trace_ids:
        assert spans(run, trace_ids=[tid]).equals(spans(bare, trace_ids=[tid]))
    assert read_steps(run) == read_steps(bare)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tracer.TraceFileWarning)
        yield


def _damage_batches(file: str, keep: int) -> None:
    """Overwrite the middle of every record batch but ``keep`` (size and footer stay): reading them warns."""
    layout = read_layout(file)
    with open(file, "r+b") as f:
        for i, (offset, meta_len, body_len) in enumerate(layout.batches):
            if i != keep:
                f.seek(offset + meta_len + body_len // 2)
                f.write(b"\xa5" * (body_len // 4))


def test_a_sealed_shard_gets_its_index_and_readers_use_it(tmp_path: Any) -> None:
    run = os.fspath(tmp_path / "run")
    shard = _three_batches(run)
    assert not os.path.exists(shard_index_path(shard))
    bare = bare_copy(run, os.path.join(os.path.dirname(run), "bare"))
    assert seal_if_abandoned(shard, on_sealed=write_index).action == SEALED
    index = valid_index_of(shard)
    assert index.batch_rows == [2, 2, 1] and index.batch_steps == [[1], [2], [3]]
    assert index.batches_of_traces(pa.array(["b"])) == [1]
    _same_reads(run, bare, ["a", "b", "c"], [1, 2, 3])
    # The index is what answers: batches other than a's are damaged, and reading a's does not touch them.
    a_spans = tracer.read_spans(run, trace_ids=["a"])
    _damage_batches(shard, keep=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tracer.TraceFileWarning)
        assert tracer.read_spans(run, trace_ids=["a"]).equals(a_spans)
        assert tracer.read_spans(run, steps=[1]).equals(a_spans)


def test_readers_seal_and_index_a_dead_writers_shard(tmp_path: Any) -> None:
    run = os.fspath(tmp_path / "run")
    shard = _three_batches(run)
    assert read_trajectories(run).num_rows == 3  # the read seals it, and the seal indexes it
    valid_index_of(shard)


def test_sealing_a_closed_shard_again_writes_nothing(tmp_path: Any) -> None:
    """An already closed shard (a writer's, or sealed before) is left as it is, index included."""
    run = os.fspath(tmp_path / "run")
    sealed = _three_batches(run)
    closed = write_shard(run, [[trace_span("d", 0, 1)]])
    assert seal_if_abandoned(sealed, on_sealed=write_index).action == SEALED
    before = {f: os.stat(shard_index_path(f)) for f in (sealed, closed)}
    for f in (sealed, closed):
        assert seal_if_abandoned(f, on_sealed=write_index).action == ALREADY_CLOSED
        after = os.stat(shard_index_path(f))
        assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
            before[f].st_ino,
            before[f].st_mtime_ns,
            before[f].st_size,
        )


def test_an_index_that_cannot_be_written_never_fails_the_seal(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sidecar path taken by a directory: the shard is sealed, read whole, and one warning is logged."""
    monkeypatch.setattr(_si, "_index_warned", threading.Event())
    run = os.fspath(tmp_path / "run")
    shards = [_three_batches(run), write_shard(run, [[trace_span("d", 0, 4)]], close=False)]
    for shard in shards:
        os.makedirs(shard_index_path(shard))
    with caplog.at_level(logging.WARNING, logger="rollout_trace"):
        assert [seal_if_abandoned(s, on_sealed=write_index).action for s in shards] == [SEALED, SEALED]
    assert [r.getMessage().count("no index written") for r in caplog.records] == [1]
    assert all(load_shard_index(s) is None for s in shards)
    assert sorted(read_trajectories(run).column(S.TRACE_ID).to_pylist()) == ["a", "b", "c", "d"]
    assert not temporaries(run)


def _other_index(shard: str) -> None:
    """The sidecar of another shard under this shard's name."""
    other = os.path.join(os.path.dirname(shard), "elsewhere")
    os.makedirs(other)
    fake = write_shard(other, [[trace_span("zzz", 0, 1)], [trace_span("zzz", 1, 1)]])
    shutil.copyfile(shard_index_path(fake), shard_index_path(shard))
    shutil.rmtree(other)


def _stale_index(shard: str) -> None:
    """The shard was replaced (same name, one batch less) after its index was written."""
    keep = read_layout(shard).batches[-1][0]
    with open(shard, "rb") as f:
        data = f.read()[:keep]
    with open(shard + ".new", "wb") as f:
        f.write(data)
    os.replace(shard + ".new", shard)
    assert seal_if_abandoned(shard, on_sealed=None).action == SEALED


@pytest.mark.parametrize("lie", [_other_index, _stale_index])
def test_a_wrong_index_beside_a_sealed_shard_is_ignored(tmp_path: Any, lie: Any) -> None:
    run = os.fspath(tmp_path / "run")
    shard = _three_batches(run)
    assert seal_if_abandoned(shard, on_sealed=write_index).action == SEALED
    lie(shard)
    assert load_shard_index(shard) is None
    bare = bare_copy(run, os.path.join(os.path.dirname(run), "bare"))
    _same_reads(run, bare, ["a", "b", "c", "zzz"], [1, 2, 3])


def _run_with_dead_workers(run: str) -> list[str]:
    shards = [
        _three_batches(run),
        write_shard(run, [[trace_span("d", 0, 1), trace_span("d", 1, 1)], [trace_span("a", 2, 1)]], close=False),
        write_shard(run, [[trace_span("e", 0, 2)], [trace_span("f", 0, None)]]),
    ]
    return shards


def _outputs(run: str) -> list[str]:
    return [os.path.join(run, n) for n in sorted(load_index(run)["files"])]


def test_compacted_files_have_valid_indexes(tmp_path: Any) -> None:
    run = os.fspath(tmp_path / "run")
    _run_with_dead_workers(run)
    bare = bare_copy(run, os.path.join(os.path.dirname(run), "bare"))
    before = read_trajectories(bare)
    report = compact(run, target_bytes=1)  # one output per input
    assert report.files_out == 3 and len(report.sealed) == 2
    outputs = _outputs(run)
    assert len(outputs) == 3
    for out in outputs:
        valid_index_of(out)
    sidecars = sorted(n for n in os.listdir(run) if n.endswith(INDEX_SUFFIX))
    assert sidecars == sorted(os.path.basename(shard_index_path(o)) for o in outputs)  # the originals' went with them
    assert read_trajectories(run).equals(before)
    compact(bare, target_bytes=1 << 30)
    _same_reads(run, bare, ["a", "d", "f"], [1, 2])


def test_a_compacted_file_past_the_writers_bound_still_gets_its_index(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's memory bound drops the index of a shard that outgrows it; compaction (which holds
    the whole table anyway) indexes an output of any size, so one trajectory is still one batch's read."""
    monkeypatch.setattr(_si, "MAX_BUILD_BYTES", 1)
    run = os.fspath(tmp_path / "run")
    _run_with_dead_workers(run)
    bare = bare_copy(run, os.path.join(os.path.dirname(run), "bare"))
    report = compact(run, target_bytes=1 << 30)  # one output
    assert report.files_out == 1
    (out,) = _outputs(run)
    assert load_shard_index(out) is not None
    writer = SpanWriter(
        os.fspath(tmp_path / "writer"), META, on_close=shard_closed
    )  # the writer's builder keeps its bound
    writer.write(pa.RecordBatch.from_pylist([trace_span("z", 0, 1)], schema=S.SPAN_SCHEMA))
    writer.close()
    assert not [n for n in os.listdir(tmp_path / "writer") if n.endswith(INDEX_SUFFIX)]
    compact(bare, target_bytes=1 << 30)
    _same_reads(run, bare, ["a", "d", "f"], [1, 2])


def test_a_compaction_that_stops_before_the_index_is_read_whole(tmp_path: Any) -> None:
    """A crash after the rename and before the index (or a stale, foreign index) leaves a file read whole."""
    run = os.fspath(tmp_path / "run")
    _run_with_dead_workers(run)
    compact(run, target_bytes=1)
    first, second, third = _outputs(run)
    bare = bare_copy(run, os.path.join(os.path.dirname(run), "bare"))  # compacted files without any index
    os.remove(shard_index_path(first))  # the crash: no index
    shutil.copyfile(shard_index_path(third), shard_index_path(second))  # another output's index
    with open(shard_index_path(third), "r+b") as f:  # a torn one
        f.truncate(os.path.getsize(shard_index_path(third)) // 2)
    assert [load_shard_index(o) for o in (first, second, third)] == [None, None, None]
    with _quiet():
        _same_reads(run, bare, ["a", "d", "e", "f"], [1, 2])


def test_a_failing_index_never_fails_the_compaction(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(spans: pa.Table) -> pa.Table:
        raise RuntimeError("summary broke")

    monkeypatch.setattr(_si, "_index_warned", threading.Event())
    monkeypatch.setattr(
        _si,
        "builder",
        lambda bounded=True: _si.ShardIndexBuilder(SUMMARY_SPAN_COLUMNS, broken, step_partials, bounded=bounded),
    )
    run = os.fspath(tmp_path / "run")
    _run_with_dead_workers(run)
    with caplog.at_level(logging.WARNING, logger="rollout_trace"):
        report = compact(run, target_bytes=1)
    assert report.files_out == 3 and report.rows == 10
    assert sum(r.getMessage().count("no index written") for r in caplog.records) == 1
    monkeypatch.undo()
    assert not temporaries(run) and not [n for n in os.listdir(run) if n.endswith(INDEX_SUFFIX)]
    assert tracer.read_spans(run).num_rows == 10


def test_an_interrupted_merge_leaves_no_index_behind(tmp_path: Any) -> None:
    """A merge's ``.tmp`` and an index uploaded beside it (object stores do so before the rename) are removed."""
    run = os.fspath(tmp_path / "run")
    _run_with_dead_workers(run)
    name = "compacted_20260101T000000_0badcafe" + S.FILE_SUFFIX
    shard = write_shard(os.fspath(tmp_path / "elsewhere"), [[trace_span("x", 0, 1)]])
    shutil.copyfile(shard, os.path.join(run, name + ".tmp"))
    shutil.copyfile(shard_index_path(shard), shard_index_path(os.path.join(run, name)))
    assert load_shard_index(os.path.join(run, name)) is None  # no such file: the index means nothing
    assert "x" not in tracer.read_spans(run, columns=[S.TRACE_ID]).column(0).to_pylist()
    compact(run)
    assert not os.path.exists(shard_index_path(os.path.join(run, name)))
    assert not os.path.exists(os.path.join(run, name + ".tmp"))


# -- random runs, random kill points ------------------------------------------------------------

_worker = st.fixed_dictionaries(
    {
        "batches": st.lists(
            st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0, 1, None])), min_size=1, max_size=3),
            min_size=1,
            max_size=4,
        ),
        "end": st.sampled_from(["closed", "killed", "torn"]),
    }
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=st.lists(_worker, min_size=1, max_size=3), step=st.sampled_from([0, 1]), pick=st.integers(0, 5))
def test_random_runs_killed_anywhere_read_the_same_indexed(workers: list[dict[str, Any]], step: int, pick: int) -> None:
    """Workers killed after any batch (or torn inside one): sealed, indexed, compacted, every read is unchanged."""
    root = tempfile.mkdtemp(prefix="rt-kill-")
    run = os.path.join(root, "run")
    try:
        n = 0
        for w, spec in enumerate(workers):
            batches = []
            for rows in spec["batches"]:
                batch = []
                for traj, at in rows:
                    batch.append(trace_span(f"w{w}t{traj}", n, at))
                    n += 1
                batches.append(batch)
            shard = write_shard(run, batches, close=spec["end"] == "closed")
            if spec["end"] == "torn":
                with open(shard, "r+b") as f:
                    f.truncate(os.path.getsize(shard) - 3)
        bare = bare_copy(run, os.path.join(os.path.dirname(run), "bare"))
        tids = sorted({f"w{w}t{pick}" for w in range(len(workers))})
        with _quiet():
            _same_reads(run, bare, tids, [step])
            for name in os.listdir(run):
                full = os.path.join(run, name)
                if (
                    name.endswith(S.FILE_SUFFIX)
                    and seal_if_abandoned(full, on_sealed=write_index).action == ALREADY_CLOSED
                ):
                    valid_index_of(full)
            compact(run, target_bytes=256)
            compact(bare, target_bytes=256)
            _same_reads(run, bare, tids, [step])
            for out in _outputs(run):
                valid_index_of(out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
