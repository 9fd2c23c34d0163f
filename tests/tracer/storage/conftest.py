"""Fixtures of the storage tests: small trace files built with the real writer."""

from __future__ import annotations

import contextlib
import os
import re
import zlib
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest
from scale_fixtures import MotoServer, need
from storage_fixtures import span_rows

import tracer
from tracer import schema as S
from tracer.index import rollup
from tracer.index.closed import shard_closed
from tracer.index.shard import shard_index_path
from tracer.storage.writer import SpanWriter


def write_trace_file(
    path: str,
    batches: int,
    rows: int = 2,
    metadata: dict[str, str] | None = None,
    close: bool = True,
    tag: str | None = None,
) -> list[list[str]]:
    """Write a stream trace file of ``batches`` batches with the real :class:`SpanWriter`; return span ids per batch.

    Span ids start with ``tag`` (default: the file's name), so files never share spans.
    """
    meta = {S.META_SCHEMA_VERSION: S.SCHEMA_VERSION, **(metadata or {})}
    writer = SpanWriter(os.path.dirname(path), meta, on_close=shard_closed)
    ids = []
    for b in range(batches):
        rows_of = span_rows(b, rows, os.path.basename(path) if tag is None else tag)
        batch = pa.RecordBatch.from_pylist(rows_of, schema=tracer.schema.SPAN_SCHEMA)
        writer.write(batch)
        ids.append(batch.column(S.SPAN_ID).to_pylist())
    written = writer.path
    if close:
        writer.close()
    else:  # like a killed writer: batches durable, no end-of-stream marker
        writer._abandon()
    assert written is not None
    os.replace(written, path)
    # Its index names the file it was written as: under another name it is only clutter.
    with contextlib.suppress(FileNotFoundError):
        os.remove(shard_index_path(written))
    return ids


@pytest.fixture()
def make_trace_file(tmp_path: os.PathLike[str]) -> Callable[..., tuple[str, list[list[str]]]]:
    """``make(name, batches, rows=2, ...)`` -> (path, span ids per batch), in a fresh run directory."""

    def make(name: str = "run.arrow", batches: int = 3, **kwargs: object) -> tuple[str, list[list[str]]]:
        run = os.path.join(os.fspath(tmp_path), "run")
        os.makedirs(run, exist_ok=True)
        path = os.path.join(run, name)
        return path, write_trace_file(path, batches, **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def write_trace() -> Callable[..., list[list[str]]]:
    """:func:`write_trace_file`, for tests that write many files (property tests)."""
    return write_trace_file


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoServer]:
    """A moto S3 server on 127.0.0.1 with the AWS_* environment pointing at it."""
    need("moto", "'moto[server]'")
    server = MotoServer()
    old = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        yield server
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture()
def bucket(s3: MotoServer, request: pytest.FixtureRequest) -> str:
    """A fresh bucket, as an s3:// URI prefix."""
    slug = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    name = f"t-{slug}-{zlib.crc32(request.node.nodeid.encode()):08x}"  # parametrized tests get buckets of their own
    s3.create_bucket(name)
    return f"s3://{name}/traces"


@pytest.fixture(scope="module")
def shard_indexes_alone() -> Iterator[None]:
    """Readers pass over every run rollup (:mod:`tracer.index.rollup`): for the tests of the shard
    indexes' own answers, which a rollup covering every file would otherwise give in their place."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(rollup, "covering", lambda *_: None)
        yield
