"""One torn-file reader: read_spans, check and repair keep the same batches of a file torn or bit-rotted anywhere."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from tracer import schema as S
from tracer.index.rollup import ROLLUP_NAME
from tracer.storage.check import check_path
from tracer.storage.repair import DAMAGED_SUFFIX, REPAIRED, SOUND, repair_file


def _reference_batches(data: bytes) -> int:
    """How many complete batches pyarrow's own stream reader yields before a tear (the oracle).

    An IPC file's messages are a stream after its 8-byte magic.
    """
    n = 0
    if data.startswith(b"ARROW1"):
        data = data[8:]
    try:
        reader = pa.ipc.open_stream(pa.BufferReader(data))
        while True:
            try:
                reader.read_next_batch()
            except StopIteration:
                break
            n += 1
    except (OSError, pa.ArrowException):
        pass
    return n


def _three_views(path: str, seen_repaired: dict[bytes, tuple[list[str], str]] | None = None) -> dict[str, Any]:
    """What read_spans, check and repair each keep of ``path``; repair comes last, in place.

    ``seen_repaired`` maps a repaired file's bytes to what reading it and repairing it again gave:
    both depend on those bytes alone (same name, same directory), and a sweep of cuts makes the same
    few repaired files over and over, so each distinct one is read and re-repaired once.
    """
    with open(path, "rb") as f:
        original = f.read()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            read = tracer.read_spans(path)[S.SPAN_ID].to_pylist()  # every column, as check reads
        except FileNotFoundError:
            read = []
    warned = [str(w.message) for w in caught if issubclass(w.category, tracer.TraceFileWarning)]
    report = check_path(path)
    fixed = repair_file(path)
    repaired, again = read, SOUND
    if fixed.action == REPAIRED:
        assert fixed.damaged_to == path + DAMAGED_SUFFIX and os.path.exists(fixed.damaged_to), (
            "repair must keep the original"
        )
        with open(fixed.damaged_to, "rb") as f:
            assert f.read() == original, "the original is kept byte for byte"
        repaired = []
        if fixed.repaired_to:
            with open(fixed.repaired_to, "rb") as f:
                content = f.read()
            known = None if seen_repaired is None else seen_repaired.get(content)
            if known is None:
                known = (
                    tracer.read_spans(fixed.repaired_to)[S.SPAN_ID].to_pylist(),
                    repair_file(fixed.repaired_to).action,
                )
                if seen_repaired is not None:
                    seen_repaired[content] = known
            repaired, again = known
    return {
        "read": read,
        "warned": warned,
        "check_rows": report.spans,
        "check_damaged": not report.ok,
        "repair": fixed.action,
        "repaired": repaired,
        "repair_again": again,
    }


def _assert_agree(
    path: str,
    ids: list[list[str]],
    complete: int | None,
    seen_repaired: dict[bytes, tuple[list[str], str]] | None = None,
) -> None:
    views = _three_views(path, seen_repaired)
    if complete is not None:
        expected = [s for batch in ids[:complete] for s in batch]
        assert views["read"] == expected, "the reader keeps exactly the complete batches"
    assert views["check_rows"] == len(views["read"]), views
    assert views["repaired"] == views["read"], views
    assert views["check_damaged"] == bool(views["warned"]) == (views["repair"] != SOUND), views
    assert views["repair_again"] == SOUND, "a repaired file is sound: repairing again changes nothing"
    for message in views["warned"]:
        if "recovered" in message:
            assert f"recovered {len(views['read'])} span(s)" in message, message


@pytest.mark.slow
def test_a_tear_at_every_byte_offset_keeps_the_same_batches_everywhere(
    tmp_path: os.PathLike[str], write_trace: Callable[..., list[list[str]]]
) -> None:
    """Cut a 3-batch file at every byte: reader, check and repair keep the batches pyarrow's reader completes."""
    source = os.path.join(os.fspath(tmp_path), "src", "x.arrow")
    os.makedirs(os.path.dirname(source))
    ids = write_trace(source, 3, rows=1)
    with open(source, "rb") as f:
        data = f.read()
    kept_counts = set()
    seen_repaired: dict[bytes, tuple[list[str], str]] = {}
    # The cuts live in RAM when the machine has a tmpfs: the same reads and repairs, without
    # repair's two fsyncs per cut waiting on a shared disk (they dominated the sweep's time).
    ram = "/dev/shm"
    with tempfile.TemporaryDirectory(dir=ram if os.access(ram, os.W_OK) else os.fspath(tmp_path)) as cut_dir:
        path = os.path.join(cut_dir, "x.arrow")
        for cut in range(len(data) + 1):
            # A fresh file per cut: rewriting one in place (or renaming over one) makes ext4 flush it first.
            for name in os.listdir(cut_dir):
                os.remove(os.path.join(cut_dir, name))
            with open(path, "wb") as f:
                f.write(data[:cut])
            complete = _reference_batches(data[:cut])
            kept_counts.add(complete)
            _assert_agree(path, ids, complete, seen_repaired)
    assert kept_counts == {0, 1, 2, 3}
    assert len(seen_repaired) >= 3, "the repaired files of 1, 2 and 3 kept batches were each read and repaired again"


@pytest.fixture(scope="module")
def three_batches(
    tmp_path_factory: pytest.TempPathFactory, write_trace: Callable[..., list[list[str]]]
) -> Callable[[int], tuple[bytes, list[list[str]]]]:
    """``rows`` -> the bytes and span ids of a 3-batch ``x.arrow`` of that many rows per batch.

    Written once per row count: the writer makes the same bytes every time, so each example
    starts from what a fresh write would give, without paying for it.
    """
    made: dict[int, tuple[bytes, list[list[str]]]] = {}

    def get(rows: int) -> tuple[bytes, list[list[str]]]:
        if rows not in made:
            path = os.path.join(str(tmp_path_factory.mktemp("source")), "x.arrow")
            ids = write_trace(path, 3, rows=rows)
            with open(path, "rb") as f:
                made[rows] = f.read(), ids
        return made[rows]

    return get


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fraction=st.floats(0.0, 1.0))
def test_a_tear_anywhere_keeps_the_same_batches_everywhere(
    tmp_path_factory: pytest.TempPathFactory,
    three_batches: Callable[[int], tuple[bytes, list[list[str]]]],
    fraction: float,
) -> None:
    """Cut a 3-batch file at a drawn byte: reader, check and repair keep the batches pyarrow's reader completes."""
    run = str(tmp_path_factory.mktemp("tear"))
    path = os.path.join(run, "x.arrow")
    data, ids = three_batches(1)
    cut = int(fraction * len(data))
    with open(path, "wb") as f:
        f.write(data[:cut])
    _assert_agree(path, ids, _reference_batches(data[:cut]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bit_rot_anywhere_never_raises_and_all_three_agree(
    tmp_path_factory: pytest.TempPathFactory,
    three_batches: Callable[[int], tuple[bytes, list[list[str]]]],
    data: st.DataObject,
) -> None:
    """Overwrite bytes anywhere in a file: nothing raises, and reader, check and repair keep the same spans."""
    run = str(tmp_path_factory.mktemp("rot"))
    path = os.path.join(run, "x.arrow")
    written, ids = three_batches(3)
    content = bytearray(written)
    for _ in range(data.draw(st.integers(1, 4), label="damaged bytes")):
        at = data.draw(st.integers(0, len(content) - 1), label="offset")
        content[at] = data.draw(st.integers(0, 255), label="value")
    with open(path, "wb") as f:
        f.write(bytes(content))
    _assert_agree(path, ids, None)


def test_a_footerless_compacted_file_reads_as_a_stream(
    tmp_path: os.PathLike[str], make_trace_file: Callable[..., tuple[str, list[list[str]]]]
) -> None:
    """A compacted (IPC file) whose footer rotted away: its batches still read, with a warning; check agrees."""
    from tracer.storage.compact import compact

    path, ids = make_trace_file("a.arrow", 2)
    make_trace_file("b.arrow", 2)
    compact(os.path.dirname(path))
    (compacted,) = tracer.list_trace_files(os.path.dirname(path))
    with open(compacted, "r+b") as f:
        f.truncate(os.path.getsize(compacted) - 30)
    views = _three_views(compacted)
    assert len(views["read"]) == 8 and views["warned"] and "footer" in views["warned"][0]
    assert views["check_rows"] == 8 and views["check_damaged"] and views["repaired"] == views["read"]


def test_reading_a_list_of_files_equals_reading_their_directory(
    tmp_path: os.PathLike[str], make_trace_file: Callable[..., tuple[str, list[list[str]]]]
) -> None:
    """read_spans, iter_batches and list_trace_files take a list of files and directories; each file is read once."""
    a, _ = make_trace_file("a.arrow", 2)
    b, _ = make_trace_file("b.arrow", 3)
    run = os.path.dirname(a)
    nested = os.path.join(os.fspath(tmp_path), "other")
    os.makedirs(nested)
    c = os.path.join(nested, "c.arrow")
    shutil.copyfile(b, c)
    by_dir = tracer.read_spans(run)
    assert tracer.read_spans([a, b]).equals(by_dir)
    assert tracer.read_spans([run, a]).equals(by_dir), "a file named twice is read once"
    assert tracer.list_trace_files([run, nested]) == [a, b, c]
    assert tracer.list_trace_files((a, nested)) == [a, c]
    assert [f for f, _ in tracer.iter_batches([b, a], ["span_id"])] == [b, b, b, a, a]
    assert (
        tracer.read_trajectories([a, b]).sort_by("trace_id").equals(tracer.read_trajectories(run).sort_by("trace_id"))
    )
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tracer.read_spans([a, os.path.join(run, "missing.arrow")])


def test_repair_of_a_directory_is_idempotent(
    tmp_path: os.PathLike[str], make_trace_file: Callable[..., tuple[str, list[list[str]]]]
) -> None:
    """check --repair twice leaves the directory as the first run left it, and keeps every original byte."""
    path, _ = make_trace_file("torn.arrow", 4)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 50)
    make_trace_file("good.arrow", 2)
    with open(os.path.join(os.path.dirname(path), "empty.arrow"), "wb"):
        pass
    run = os.path.dirname(path)

    def state() -> dict[str, bytes]:
        out = {}
        for name in sorted(os.listdir(run)):
            with open(os.path.join(run, name), "rb") as f:
                out[name] = f.read()
        return out

    first = check_path(run, repair=True)
    assert not first.ok and sorted(n for n in os.listdir(run) if not n.startswith(ROLLUP_NAME)) == [
        "empty.arrow.damaged",
        "good.arrow",
        "torn.arrow.damaged",
        "torn.repaired.arrow",
    ]
    after_first = state()
    second = check_path(run, repair=True)
    assert second.ok and state() == after_first
