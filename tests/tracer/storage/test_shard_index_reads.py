"""The cheap reads behind one step of a run with many shards: what each shard costs must not change what is read.

Readers check every listed shard's index against its shard before a step or
trace-id read (``tracer.index.shard``): the sidecar's metadata is read
by hand from its first message, the shard's footer with two positional reads,
and the trusted batch read reuses what its walk already parsed. Each is checked
here against what pyarrow (or the plain, untrusted read) says of the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_fixtures import trace_span, write_shard

import tracer
from tracer import schema as S
from tracer.index.shard import load_shard_index, shard_index_path
from tracer.storage import files as F
from tracer.storage.files import closed_file_metadata, ends_closed, footer_bytes, read_batches

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def shard() -> Iterator[str]:
    """A closed shard of four batches (steps 0, 1, 1, 2) with its index; tests copy it before changing it."""
    run = tempfile.mkdtemp(prefix="rt-index-reads-")
    batches = [[trace_span(f"t{b}{i}", i, step) for i in range(3)] for b, step in enumerate([0, 1, 1, 2])]
    path = write_shard(run, batches)
    assert load_shard_index(path) is not None
    yield path
    shutil.rmtree(run, ignore_errors=True)


def _copy(shard: str, where: str) -> str:
    os.makedirs(where, exist_ok=True)
    out = os.path.join(where, os.path.basename(shard))
    shutil.copyfile(shard, out)
    shutil.copyfile(shard_index_path(shard), shard_index_path(out))
    return out


def _pyarrow_footer(path: str) -> tuple[bytes, int] | None:
    """What the footer read must agree with: pyarrow opens the file, and the footer is its last bytes."""
    try:
        with pa.OSFile(path) as src:
            batches = pa.ipc.open_file(src).num_record_batches
    except (OSError, pa.ArrowException):
        return None
    with open(path, "rb") as f:
        data = f.read()
    length = int.from_bytes(data[-10:-6], "little", signed=True)
    return data[-10 - length :], batches


@FAST
@given(cut=st.integers(0, 200), flip=st.one_of(st.none(), st.integers(1, 200)), byte=st.integers(0, 255))
def test_footer_read_agrees_with_pyarrow(shard: str, tmp_path: Any, cut: int, flip: int | None, byte: int) -> None:
    """Whatever happened to a shard's tail (cut short, a byte changed), the footer read says what pyarrow says."""
    path = os.path.join(os.fspath(tmp_path), f"cut{cut}_{flip}_{byte}.arrow")
    with open(shard, "rb") as f:
        data = bytearray(f.read())
    if flip is not None and flip <= len(data):
        data[-flip] = byte
    with open(path, "wb") as f:
        f.write(bytes(data[: len(data) - cut]))
    got = footer_bytes(path)
    want = _pyarrow_footer(path)
    if want is None:
        # pyarrow refuses more (it parses the whole footer): a footer read here must still be
        # one whose digest no index can match unless the bytes are the writer's.
        assert got is None or got[0] != footer_bytes(shard)[0]  # type: ignore[index]
    else:
        assert got == want
    assert ends_closed(path) == bytes(data[: len(data) - cut]).endswith(F.ARROW_FILE_MAGIC)


def test_footer_read_and_tail_check_refuse_what_is_not_a_file(tmp_path: Any) -> None:
    """A directory or a FIFO named like a shard: no footer, not closed, and nothing blocks."""
    folder = os.path.join(os.fspath(tmp_path), "dir.arrow")
    os.mkdir(folder)
    fifo = os.path.join(os.fspath(tmp_path), "fifo.arrow")
    os.mkfifo(fifo)
    for path in (folder, fifo, os.path.join(os.fspath(tmp_path), "missing.arrow")):
        assert footer_bytes(path) is None
        assert not ends_closed(path)
        assert closed_file_metadata(path) is None


_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)


#: Large values (2-4k characters) built from a short text, so generating them draws little data
#: (arbitrary 2-3k-character texts tripped hypothesis's data_too_large health check in CI).
_large = st.builds(lambda t, n: (t or "x") * n, _text, st.integers(100, 120)).map(lambda v: v[:4000].ljust(2000, "y"))


@FAST
@given(meta=st.dictionaries(_text, st.one_of(_text, _large), max_size=6))
def test_metadata_read_by_hand_equals_pyarrow(tmp_path: Any, meta: dict[str, str]) -> None:
    """Any schema metadata (unicode, empty, large values) reads back as pyarrow reads it; a stream is not a file."""
    base = os.fspath(tmp_path)
    path, stream = os.path.join(base, "f.arrow"), os.path.join(base, "s.arrow")
    schema = pa.schema([pa.field("x", pa.int64())], metadata=meta)
    batch = pa.record_batch([pa.array([1, 2])], schema=schema)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as w:
        w.write_batch(batch)
    with pa.OSFile(stream, "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
        w.write_batch(batch)
    with pa.OSFile(path) as src:
        want = {k.decode(): v.decode() for k, v in (pa.ipc.open_file(src).schema.metadata or {}).items()}
    assert closed_file_metadata(path) == want
    some = set(list(want)[:2])
    assert closed_file_metadata(path, some) == {k: v for k, v in want.items() if k in some}
    assert closed_file_metadata(stream) is None
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 1)
    assert closed_file_metadata(path) is None


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.floats(0, 2), st.text(max_size=2))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=5), max_leaves=12)


def _valid(rows: Any, steps: Any, batches: int) -> bool:
    """The rule an index's batch lists must follow (the reference the loader is checked against)."""
    if not (isinstance(rows, list) and isinstance(steps, list) and len(rows) == len(steps) == batches):
        return False
    if not all(type(r) is int and r >= 0 for r in rows):
        return False
    return all(isinstance(s, list) and all(v is None or type(v) is int for v in s) for s in steps)


def _with_meta(side: str, changes: dict[str, str]) -> None:
    with pa.OSFile(side) as src:
        table = pa.ipc.open_file(src).read_all()
    meta = dict(table.schema.metadata or {})
    meta.update({k.encode(): v.encode() for k, v in changes.items()})
    with pa.OSFile(side, "wb") as sink, pa.ipc.new_file(sink, table.schema.with_metadata(meta)) as w:
        w.write_table(table)


_ROWS, _STEPS = [3, 3, 3, 3], [[0], [1], [1], [2]]
#: One thing wrong with the batch lists (or nothing): ``(rows, steps)``.
_SHAPES = [
    (_ROWS, _STEPS),
    ([3, 3, True, 3], _STEPS),
    ([3, 3, -1, 3], _STEPS),
    ([3, 3, 3.0, 3], _STEPS),
    ([3, 3, None, 3], _STEPS),
    ([3, 3, "3", 3], _STEPS),
    ([3, 3, [3], 3], _STEPS),
    (_ROWS[:3], _STEPS[:3]),
    (_ROWS, [[0], [True], [1], [2]]),
    (_ROWS, [[0], [1.0], [1], [2]]),
    (_ROWS, [[0], ["1"], [1], [2]]),
    (_ROWS, [[0], [[1]], [1], [2]]),
    (_ROWS, [[0], 1, [1], [2]]),
    (_ROWS, [[0], None, [1], [2]]),
    (_ROWS, [[0], [None, 1], [1], []]),
    ({"a": 1}, _STEPS),
]


@pytest.mark.parametrize(("rows", "steps"), _SHAPES)
def test_batch_lists_with_one_thing_wrong_are_not_trusted(shard: str, rows: Any, steps: Any) -> None:
    """A bool, a negative count, a float, a string, a nested list, a missing batch: the index is not used."""
    _trusted_only_when_well_formed(shard, rows, steps)


@settings(max_examples=25, deadline=None)
@given(rows=_json_values(), steps=_json_values())
def test_batch_lists_of_any_shape_are_trusted_only_when_well_formed(shard: str, rows: Any, steps: Any) -> None:
    """Batch rows and steps of any JSON shape: used only when well formed."""
    _trusted_only_when_well_formed(shard, rows, steps)


def _trusted_only_when_well_formed(shard: str, rows: Any, steps: Any) -> None:
    """Batch rows and steps in a sidecar's metadata: used only when well formed; reads match the spans either way."""
    where = tempfile.mkdtemp(prefix="rt-index-meta-")
    try:
        path = _copy(shard, where)
        _with_meta(
            shard_index_path(path),
            {S.META_INDEX_BATCH_ROWS: json.dumps(rows), S.META_INDEX_BATCH_STEPS: json.dumps(steps)},
        )
        index = load_shard_index(path)
        assert (index is not None) == _valid(rows, steps, 4)
        if index is not None:
            assert (index.batch_rows, index.batch_steps) == (rows, steps)
        else:  # without an index the reader reads every batch: the step's spans are all there
            got = tracer.read_spans(path, columns=[S.SPAN_ID], steps=[1])
            assert sorted(got.column(0).to_pylist()) == sorted(f"t{b}{i}-{i}" for b in (1, 2) for i in range(3))
    finally:
        shutil.rmtree(where, ignore_errors=True)


@settings(max_examples=20, deadline=None)
@given(chosen=st.lists(st.integers(0, 3), max_size=4), columns=st.sampled_from([[S.SPAN_ID], [S.STEP, S.NAME], None]))
def test_trusted_read_returns_what_the_plain_read_returns(shard: str, chosen: list[int], columns: Any) -> None:
    """Reading some batches where the footer puts them (the index vouches) equals reading them by walking the file."""
    cols = list(S.SPAN_COLUMNS) if columns is None else columns
    size = os.path.getsize(shard)
    trusted = read_batches(shard, cols, chosen, expect_size=size, trust_footer=True)
    plain = read_batches(shard, cols, chosen, expect_size=size)
    a, b = list(trusted), list(plain)
    assert [x.equals(y) for x, y in zip(a, b, strict=True)] == [True] * len(b)
    assert trusted.result == plain.result
    assert trusted.schema is not None and trusted.schema.equals(plain.schema, check_metadata=True)  # type: ignore[arg-type]
