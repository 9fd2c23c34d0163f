"""The one reader of trace files, whole or damaged: :func:`read_batches`.

The messages are walked by hand before pyarrow decodes anything: a torn file reads up to its last complete batch
(:attr:`FileRead.damage`); a file with span column types readers cannot use is skipped whole; a batch is
decompressed only while the bytes it declares fit the file's budget, ``max(MIN_BUDGET_BYTES, expansion x size on
disk)``, else it and the later ones are refused (:attr:`FileRead.refused`). Only regular files are opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import os
import stat
import struct
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, BinaryIO, TypeVar

import pyarrow as pa

from tracer import schema as S
from tracer.storage import uri as _uri

#: First bytes of an Arrow IPC *file* (streams start with a continuation marker).
ARROW_FILE_MAGIC = b"ARROW1"
#: The 8 bytes that end a cleanly closed Arrow IPC stream.
EOS_MARKER = b"\xff\xff\xff\xff\x00\x00\x00\x00"
#: Environment variable: decompressed bytes allowed per byte on disk (default :data:`MAX_EXPANSION`).
ENV_MAX_EXPANSION = "ROLLOUT_TRACE_MAX_EXPANSION"
#: Default budget factor: a file may decompress to this many times its size on disk (real ones expand 3-10x).
MAX_EXPANSION = 256
#: Every file may decompress to at least this many bytes, however small it is.
MIN_BUDGET_BYTES = 64 * 1024 * 1024
#: Bytes charged per row and column read, for what materialising a batch costs beyond its buffers.
ROW_COST_BYTES = 8

_T = TypeVar("_T")
_CONTINUATION = 0xFFFFFFFF
#: One Block of an IPC footer (File.fbs: offset, metaDataLength, padding, bodyLength).
_BLOCK = struct.Struct("<qi4xq")
_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3


class _CorruptError(ValueError):
    """A message header that cannot be right (bounds, kinds)."""


class _TornError(Exception):
    """A message that does not fit in what is left of the file."""


@dataclasses.dataclass
class FileRead:
    """What reading one trace file found."""

    path: str
    #: Its size on disk when reading began.
    size: int = 0
    #: True for an IPC *file* (with footer), False for a stream.
    file_format: bool = False
    schema_version: str = ""
    #: Record batches returned to the caller (``rows`` their spans).
    batches: int = 0
    rows: int = 0
    #: Complete record batches the file holds (whether read or not).
    batches_in_file: int = 0
    #: The file ended cleanly (end-of-stream marker, or a sound footer).
    closed: bool = False
    #: Why nothing was read: the file as a whole is not a usable trace file.
    skipped: str = ""
    #: ``skipped`` or ``damage`` is something repair can set aside (torn, empty, not Arrow).
    repairable: bool = False
    #: Why reading stopped before the end (a torn or corrupt batch).
    damage: str = ""
    #: What was refused for its declared size (see the module docstring).
    refused: str = ""
    #: Where the last complete message ends (the ``resume`` offset of a later read).
    end: int = 0

    @property
    def sound(self) -> bool:
        """Nothing skipped, damaged or refused (the file may still be open)."""
        return not (self.skipped or self.damage or self.refused)

    @property
    def complete(self) -> bool:
        """Sound, closed, and every batch of the file was returned: safe to replace by a copy."""
        return self.sound and self.closed and self.batches == self.batches_in_file

    def describe(self) -> str:
        """One sentence for a warning or a report; empty when there is nothing to say."""
        if self.skipped:
            return f"{self.path}: skipped, {self.skipped}"
        if self.refused:  # a read stops at the first refusal or damage: never both
            return f"{self.path}: {self.refused}; kept {self.batches} batch(es), {self.rows} span(s)"
        kept = f"{self.batches} complete batch(es); recovered {self.rows} span(s)"
        return f"{self.path}: damaged after {kept} ({self.damage})" if self.damage else ""


@dataclasses.dataclass
class _Message:
    offset: int
    body: int  # where the body starts
    end: int  # where the next message starts
    kind: int
    rows: int
    buffers: list[tuple[int, int]]
    compressed: bool


#: Stands for a batch before a resume point (never read).
_SKIPPED = _Message(offset=-1, body=-1, end=-1, kind=_RECORD_BATCH, rows=0, buffers=[], compressed=False)


class _Flat:
    """Bounds-checked reads from a flatbuffer (Arrow's Message.fbs, File.fbs)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def _get(self, fmt: str, pos: int) -> Any:
        if pos < 0 or pos + struct.calcsize(fmt) > len(self.data):  # struct caches compiled formats
            raise _CorruptError(f"header field at {pos} outside its {len(self.data)} bytes")
        return struct.unpack_from(fmt, self.data, pos)[0]

    def root(self) -> int:
        return int(self._get("<I", 0))

    def field(self, table: int, slot: int) -> int | None:
        vtable = table - int(self._get("<i", table))
        vt_size = int(self._get("<H", vtable))
        if 4 + 2 * slot + 2 > vt_size:
            return None
        off = int(self._get("<H", vtable + 4 + 2 * slot))
        return table + off if off else None

    def scalar(self, table: int, slot: int, fmt: str) -> int:
        pos = self.field(table, slot)
        return 0 if pos is None else int(self._get(fmt, pos))

    def ref(self, table: int, slot: int) -> int | None:
        pos = self.field(table, slot)
        return None if pos is None else pos + int(self._get("<I", pos))

    def count(self, table: int, slot: int, width: int) -> int:
        """Entries of a vector of ``width``-byte structs (0 when absent), checked to fit in the buffer."""
        pos = self.ref(table, slot)
        n = 0 if pos is None else int(self._get("<I", pos))
        if pos is not None and pos + 4 + n * width > len(self.data):
            raise _CorruptError(f"vector of {n} entries runs past its header")
        return n

    def structs(self, table: int, slot: int, fmt: str) -> list[tuple[int, ...]]:
        width = struct.calcsize(fmt)
        n, pos = self.count(table, slot, width), self.ref(table, slot) or 0
        return [struct.unpack_from(fmt, self.data, pos + 4 + i * width) for i in range(n)]


def _parse_header(meta: bytes, offset: int, body: int) -> _Message:
    fb = _Flat(meta)
    msg = fb.root()
    kind = fb.scalar(msg, 1, "<B")
    body_len = fb.scalar(msg, 3, "<q")
    if body_len < 0:
        raise _CorruptError(f"message at byte {offset} declares a body of {body_len} bytes")
    rows, buffers, compressed = 0, [], False
    if kind in (_DICTIONARY, _RECORD_BATCH):
        header = fb.ref(msg, 2)
        if header is None:
            raise _CorruptError(f"batch message at byte {offset} has no header")
        batch = fb.ref(header, 1) if kind == _DICTIONARY else header
        if batch is None:
            raise _CorruptError(f"dictionary message at byte {offset} has no data")
        rows = fb.scalar(batch, 0, "<q")
        buffers = [(int(o), int(n)) for o, n in fb.structs(batch, 2, "<qq")]
        compressed = fb.field(batch, 3) is not None
        if rows < 0 or any(o < 0 or n < 0 or o + n > body_len for o, n in buffers):
            raise _CorruptError(f"batch at byte {offset} declares rows or buffers outside its {body_len}-byte body")
    elif kind != _SCHEMA:
        raise _CorruptError(f"message at byte {offset} is of kind {kind}, not a schema or a batch")
    return _Message(offset, body, body + body_len, kind, rows, buffers, compressed)


#: A pyarrow file, local or remote (:func:`tracer.storage.uri.open_input`): ``read_at(n, offset)`` gives bytes.
_Source = Any


def _read_message(src: _Source, offset: int, size: int) -> _Message | None:
    """The message starting at ``offset``; None at an end-of-stream marker or at the end of the file."""
    if offset == size:
        return None
    head = src.read_at(8, offset)
    if len(head) < 4:
        raise _TornError(f"{size - offset} stray byte(s) at the end")
    prefix = 8 if struct.unpack_from("<I", head, 0)[0] == _CONTINUATION else 4  # Arrow < 0.15: no continuation
    if len(head) < prefix:
        raise _TornError(f"message at byte {offset} cut inside its length")
    (meta_len,) = struct.unpack_from("<i", head, prefix - 4)
    start = offset + prefix
    if meta_len == 0:
        return None
    if meta_len < 0:
        raise _CorruptError(f"message at byte {offset} declares a header of {meta_len} bytes")
    if start + meta_len > size:
        raise _TornError(f"message at byte {offset} declares a {meta_len}-byte header; {size - start} byte(s) are left")
    meta = src.read_at(meta_len, start)
    msg = _parse_header(meta, offset, start + meta_len)
    if msg.end > size:
        raise _TornError(f"batch at byte {offset} declares {msg.end - msg.body} body bytes; {size - msg.body} are left")
    return msg


def _walk(src: _Source, start: int, size: int) -> tuple[list[_Message], str, bool]:
    """Every message header from ``start``: (messages, why the walk stopped early, ended at an end-of-stream marker)."""
    messages: list[_Message] = []
    offset = start
    try:
        while True:
            msg = _read_message(src, offset, size)
            if msg is None:
                return messages, "", offset < size
            messages.append(msg)
            offset = msg.end
    except (_TornError, _CorruptError) as exc:
        return messages, str(exc), False


def _schema_at(src: _Source, msg: _Message) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(src.read_at(msg.end - msg.offset, msg.offset)))


def _start(src: _Source) -> int:
    """Where the stream starts: after the magic of an IPC file."""
    return 8 if src.read_at(len(ARROW_FILE_MAGIC), 0) == ARROW_FILE_MAGIC else 0


def _first_schema(src: _Source, start: int, size: int) -> tuple[_Message, pa.Schema]:
    first = _read_message(src, start, size)
    if first is None or first.kind != _SCHEMA:
        raise _CorruptError("it does not start with an Arrow schema")
    return first, _schema_at(src, first)


#: What reading a header, a schema or a footer raises when the bytes are not what they should be.
_UNREADABLE = (_TornError, _CorruptError, OSError, pa.ArrowException, UnicodeDecodeError)


@dataclasses.dataclass
class Layout:
    """Where the messages of a trace file are, for sealing it (:mod:`tracer.storage.seal`). ``batches`` and
    ``dictionaries`` are ``(offset, metadata length, body length)`` as a footer lists them; ``stop`` and ``at_eos`` as
    :class:`FileRead` says why the walk ended (an end-of-stream marker: a footer may follow)."""

    file_format: bool
    size: int
    schema_message: bytes
    batches: list[tuple[int, int, int]]
    dictionaries: list[tuple[int, int, int]]
    end: int
    stop: str
    at_eos: bool


def read_layout(path: str) -> Layout:
    """Walk the message headers of a local trace file without decoding any batch (OSError: it cannot be opened)."""
    size = _uri.file_size(path)
    with _uri.open_input(path) as src:
        start = _start(src) if size >= 8 else 0
        messages, stop, at_eos = _walk(src, start, size)
        schema = b""
        if messages and messages[0].kind == _SCHEMA:
            schema = src.read_at(messages[0].end - messages[0].offset, messages[0].offset)
        blocks = {
            kind: [(m.offset, m.body - m.offset, m.end - m.body) for m in messages if m.kind == kind]
            for kind in (_RECORD_BATCH, _DICTIONARY)
        }
        end = messages[-1].end if messages else start
        return Layout(start == 8, size, schema, blocks[_RECORD_BATCH], blocks[_DICTIONARY], end, stop, at_eos)


def footer_for(layout: Layout) -> bytes:
    """The bytes pyarrow writes after ``layout``'s batches when it closes an IPC file (end-of-stream marker, footer)."""
    schema = pa.ipc.read_schema(pa.py_buffer(layout.schema_message))
    # pyarrow builds the footer for as many empty batches; its fixed-width Blocks then say where the real ones are.
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, schema) as writer:
        empty = pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)
        for _ in layout.batches:
            writer.write_batch(empty)
    data = sink.getvalue()
    (footer_len,) = struct.unpack_from("<i", data, len(data) - 10)
    footer = bytearray(data[len(data) - 10 - footer_len : len(data) - 10])
    fb = _Flat(bytes(footer))
    count = fb.count(fb.root(), 3, _BLOCK.size)  # Footer.recordBatches
    vector = fb.ref(fb.root(), 3) or 0
    if count != len(layout.batches):
        raise ValueError(f"pyarrow's footer lists {count} batches, not {len(layout.batches)}")
    for i, block in enumerate(layout.batches):
        _BLOCK.pack_into(footer, vector + 4 + i * _BLOCK.size, *block)
    return EOS_MARKER + bytes(footer) + struct.pack("<i", footer_len) + ARROW_FILE_MAGIC


def ends_closed(path: str) -> bool:
    """True when ``path`` is a regular file that ends like a closed trace file: a stream's end-of-stream marker or a
    file's magic (the footer itself is checked by :func:`read_batches`)."""
    n, tail = len(EOS_MARKER), None
    if not _uri.is_remote(path):  # a plain descriptor: readers call this for every shard they list
        tail = _on_regular(path, n, lambda fd, size: os.pread(fd, n, size - n))
    else:
        with contextlib.suppress(OSError), _uri.open_input(path) as f:
            tail = f.read_at(n, f.size() - n) if f.size() >= n else None
    return tail is not None and (tail == EOS_MARKER or tail.endswith(ARROW_FILE_MAGIC))


def _footer(read_at: Callable[[int, int], bytes], size: int, use: Callable[[_Flat, bytes], _T]) -> _T | None:
    """``use(footer, its length and the magic)`` of an IPC file read by ``read_at(n, offset)``; None without one."""
    tail = read_at(10, size - 10) if size >= 8 + 10 else b""
    if len(tail) != 10 or tail[4:] != ARROW_FILE_MAGIC:
        return None
    (footer_len,) = struct.unpack_from("<i", tail, 0)
    if footer_len <= 0 or footer_len > size - 18:
        return None
    footer = read_at(footer_len, size - 10 - footer_len)
    if len(footer) != footer_len:
        return None
    try:
        return use(_Flat(footer), tail)
    except _CorruptError:
        return None


def _footer_blocks(src: _Source, size: int) -> list[tuple[int, ...]] | None:
    """``(offset, metadata length, body length)`` of each batch an IPC file's footer lists; None without a footer."""
    return _footer(src.read_at, size, lambda fb, _: fb.structs(fb.root(), 3, "<qi4xq"))


def _on_regular(path: str, min_size: int, use: Callable[[int, int], _T]) -> _T | None:
    """``use(descriptor, size)`` of the local ``path`` opened read-only; None on OSError or unless it is a regular file
    of at least ``min_size`` bytes, checked before the open (a FIFO is never opened) and on the descriptor."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return use(fd, st.st_size) if stat.S_ISREG(st.st_mode) and st.st_size >= min_size else None
    except OSError:
        return None
    finally:
        os.close(fd)


def closed_file_metadata(path: str, keys: Collection[str] | None = None) -> dict[str, str] | None:
    """The schema metadata (only ``keys`` when given) of a local IPC *file* that ends closed, from its schema message
    alone (shard indexes, which this library writes and checks itself); None when the message does not parse."""
    wanted = None if keys is None else {k.encode() for k in keys}

    def read(fd: int, size: int) -> dict[str, str] | None:
        head = os.pread(fd, 16, 0)
        if head[: len(ARROW_FILE_MAGIC)] != ARROW_FILE_MAGIC:
            return None
        if os.pread(fd, len(ARROW_FILE_MAGIC), size - len(ARROW_FILE_MAGIC)) != ARROW_FILE_MAGIC:
            return None
        first, meta_len = struct.unpack_from("<Ii", head, 8)
        if first != _CONTINUATION or meta_len <= 0 or 16 + meta_len > size - 10:
            return None
        try:
            meta = pa.ipc.read_schema(pa.py_buffer(os.pread(fd, 8 + meta_len, 8))).metadata or {}
            return {k.decode(): v.decode() for k, v in meta.items() if wanted is None or k in wanted}
        except (pa.ArrowException, UnicodeDecodeError):
            return None

    return _on_regular(path, 16 + 10, read)


def footer_bytes(path: str) -> tuple[bytes, int] | None:
    """The footer of a local IPC file (everything after its end-of-stream marker) and how many batches it lists; None
    without a sound footer. Two positional reads: every shard index a reader loads is checked against it."""

    def with_count(fb: _Flat, tail: bytes) -> tuple[bytes, int]:
        return fb.data + tail, fb.count(fb.root(), 3, _BLOCK.size)

    return _on_regular(path, 8 + 10, lambda fd, size: _footer(functools.partial(os.pread, fd), size, with_count))


def compatible(found: pa.DataType, wanted: pa.DataType) -> bool:
    """True when a column of type ``found`` converts to ``wanted`` without loss for every value."""
    if found == wanted or pa.types.is_null(found):
        return True
    if pa.types.is_dictionary(found):
        return compatible(found.value_type, wanted)
    if pa.types.is_signed_integer(wanted):
        if pa.types.is_signed_integer(found):
            return bool(found.bit_width <= wanted.bit_width)
        return pa.types.is_unsigned_integer(found) and found.bit_width < wanted.bit_width
    if pa.types.is_floating(wanted):
        return pa.types.is_floating(found) and found.bit_width <= wanted.bit_width
    if pa.types.is_string(wanted) or pa.types.is_large_string(wanted):
        return pa.types.is_string(found) or pa.types.is_large_string(found)
    return False


def _buffer_count(t: pa.DataType) -> int | None:
    """IPC buffers of one field, children included; None for layouts not counted here."""
    if pa.types.is_null(t):
        return 0
    if pa.types.is_dictionary(t):
        return 2
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return 3
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        child = _buffer_count(t.value_type if not pa.types.is_map(t) else pa.struct([t.key_field, t.item_field]))
        return None if child is None else 2 + child
    if pa.types.is_fixed_size_list(t):
        child = _buffer_count(t.value_type)
        return None if child is None else 1 + child
    if pa.types.is_struct(t):
        counts = [_buffer_count(t.field(i).type) for i in range(t.num_fields)]
        return None if any(c is None for c in counts) else 1 + sum(c for c in counts if c is not None)
    if pa.types.is_primitive(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        return 2
    return None


def _wanted_buffers(schema: pa.Schema, fields: list[int]) -> set[int] | None:
    """Indices of the buffers that decompressing ``fields`` touches; None: count them all."""
    out: set[int] = set()
    pos = 0
    chosen = set(fields)
    for i, field in enumerate(schema):
        n = _buffer_count(field.type)
        if n is None:
            return None
        if i in chosen:
            out.update(range(pos, pos + n))
        pos += n
    return out


def _cost(src: _Source, msg: _Message, wanted: set[int] | None, columns: int) -> int:
    """Bytes decompressing ``msg`` needs, as the file declares them."""
    total = msg.rows * ROW_COST_BYTES * max(columns, 1)
    for i, (offset, length) in enumerate(msg.buffers):
        if wanted is not None and i not in wanted:
            continue
        if not msg.compressed or length == 0:
            total += length
            continue
        if length < 8:
            raise _CorruptError(f"batch at byte {msg.offset}: compressed buffer {i} of {length} bytes has no length")
        (declared,) = struct.unpack("<q", src.read_at(8, msg.body + offset))
        if declared < -1:
            raise _CorruptError(f"batch at byte {msg.offset}: buffer {i} declares {declared} bytes")
        total += length - 8 if declared == -1 else declared
    return total


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def conform(batch: pa.RecordBatch, columns: list[str]) -> pa.RecordBatch:
    """``batch`` with exactly ``columns``, in :data:`tracer.schema.SPAN_SCHEMA` types (missing ones as nulls)."""
    schema = pa.schema([S.SPAN_SCHEMA.field(c) for c in columns])
    names = batch.schema.names
    arrays = []
    for f in schema:
        arr = batch.column(names.index(f.name)) if f.name in names else pa.nulls(batch.num_rows, f.type)
        arrays.append(arr if arr.type == f.type else arr.cast(f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@dataclasses.dataclass(eq=False)
class TraceFileBatches:
    """The batches of one trace file (from :func:`read_batches`); iterate once, then read :attr:`result`."""

    path: str
    columns: list[str] | None
    batch_numbers: list[int] | None  # sorted, distinct
    expect_size: int | None
    resume: tuple[int, int] | None
    trust_footer: bool
    result: FileRead = dataclasses.field(init=False)
    #: The file's own schema (with its metadata) once known.
    schema: pa.Schema | None = dataclasses.field(default=None, init=False)
    # Found by :meth:`_walk_chosen`, so :meth:`_head` does not read and parse them a second time.
    _first_schema: pa.Schema | None = dataclasses.field(default=None, init=False)
    _footer_blocks: list[tuple[int, ...]] | None = dataclasses.field(default=None, init=False)

    def __post_init__(self) -> None:
        self.result = FileRead(self.path)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return (batch for batch, _ in self.with_metadata())

    def with_metadata(self) -> Iterator[tuple[pa.RecordBatch, Any]]:
        """``(batch, custom metadata)`` pairs: conformed to ``columns``, or as written when ``columns`` is None."""
        src = self._open()
        if src is None:
            return
        with src:
            head = self._head(src)
            if head is not None:
                yield from self._batches(src, *head)

    def _open(self) -> _Source | None:
        res = self.result
        try:
            if _uri.is_remote(self.path):
                res.size = _uri.file_size(self.path)
            else:
                st = os.stat(self.path)
                if not stat.S_ISREG(st.st_mode):
                    res.skipped = "not a regular file (a FIFO, device or directory named like a trace file); not opened"
                    return None
                res.size = st.st_size
        except OSError as exc:  # a dangling link, a file removed meanwhile
            res.skipped = f"cannot stat: {exc}"
            return None
        if res.size == 0:
            res.skipped, res.repairable = "empty file (0 bytes)", True
            return None
        try:
            return _uri.open_input(self.path)
        except OSError as exc:
            res.skipped = f"cannot open: {exc}"
            return None

    def _walk(self, src: _Source, start: int, size: int) -> tuple[list[_Message], str, bool, int]:
        """:func:`_walk` from the start, or the schema message and then from :attr:`resume` when that fits the file and
        no dictionary would be missed; also how many batches that skipped."""
        if self.trust_footer and self.batch_numbers is not None and self.expect_size == size and start == 8:
            with contextlib.suppress(*_UNREADABLE):  # else walk
                return self._walk_chosen(src, start, size), "", False, 0
        if self.resume is not None:
            offset, count = self.resume
            with contextlib.suppress(*_UNREADABLE):  # else read it the ordinary way, which says what is wrong
                first, schema = _first_schema(src, start, size)
                dictionaries = any(pa.types.is_dictionary(f.type) for f in schema)  # would be missed before offset
                if not dictionaries and first.end <= offset <= size and count >= 0:
                    rest, stop, at_eos = _walk(src, offset, size)
                    return [first, *rest], stop, at_eos, count
        messages, stop, at_eos = _walk(src, start, size)
        return messages, stop, at_eos, 0

    def _walk_chosen(self, src: _Source, start: int, size: int) -> list[_Message]:
        """The schema and the chosen batches' headers only, the others where the footer (vouched for by its shard index)
        puts them; raises :data:`_UNREADABLE` when that cannot be trusted."""
        first, schema = _first_schema(src, start, size)
        blocks = _footer_blocks(src, size)
        if blocks is None or any(pa.types.is_dictionary(f.type) for f in schema):
            raise _CorruptError("no footer to find batches by")
        chosen = set(self.batch_numbers or ())
        messages = [first]
        for i, (offset, meta_len, body_len) in enumerate(blocks):
            end = offset + meta_len + body_len
            msg: _Message | None = _Message(offset, offset + meta_len, end, _RECORD_BATCH, 0, [], False)
            if i in chosen:
                msg = _read_message(src, offset, size)
            if msg is None or msg.kind != _RECORD_BATCH or msg.end != end:
                raise _CorruptError(f"batch {i} is not where the footer says")
            messages.append(msg)
        self._first_schema, self._footer_blocks = schema, blocks
        return messages

    def _head(self, src: _Source) -> tuple[list[_Message], list[_Message], int, str | None, pa.Schema] | None:
        """The file's messages, its batches, how many are skipped, why it stops and its schema; else None."""
        res = self.result
        size = res.size
        start = _start(src)
        res.file_format = start == 8
        messages, stop, ended_at_eos, skipped = self._walk(src, start, size)
        res.closed = not res.file_format and ended_at_eos
        if not messages or messages[0].kind != _SCHEMA:
            res.skipped = "not a readable trace file: " + (stop or "it does not start with an Arrow schema")
            res.repairable = True
            return None
        try:
            self.schema = schema = self._first_schema or _schema_at(src, messages[0])
            schema.names  # noqa: B018 - field names in bytes that are not UTF-8 fail here
        except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
            res.skipped, res.repairable = f"not a readable trace file: {type(exc).__name__}: {exc}", True
            return None
        meta = schema.metadata or {}
        res.schema_version = meta.get(S.META_SCHEMA_VERSION.encode(), b"").decode(errors="replace")
        if not res.schema_version:
            res.skipped = "not a rollout-trace file (no schema version)"
            return None
        if major_version(res.schema_version) > major_version(S.SCHEMA_VERSION):
            res.skipped = (
                f"written in format {res.schema_version}, newer than this reader's {S.SCHEMA_VERSION}; "
                "upgrade rollout-trace"
            )
            return None
        found = {name: schema.field(i).type for name in S.SPAN_COLUMNS if (i := schema.get_field_index(name)) >= 0}
        wanted = {name: S.SPAN_SCHEMA.field(name).type for name in found}
        problem = "; ".join(
            f"column {n!r} is {t}, readers need {wanted[n]}" for n, t in found.items() if not compatible(t, wanted[n])
        )
        if problem:
            res.skipped = f"column types readers cannot use: {problem}"
            return None
        # Batches before a resume point are not walked again: placeholders keep the numbering.
        batches = [_SKIPPED] * skipped + [m for m in messages if m.kind == _RECORD_BATCH]
        res.batches_in_file = len(batches)
        res.end = messages[-1].end
        if res.file_format:
            walked = [m.offset for m in batches[skipped:]]
            blocks = self._footer_blocks if self._footer_blocks is not None else _footer_blocks(src, size)
            listed = [] if blocks is None else [b[0] for b in blocks]
            if blocks is not None and len(listed) == len(batches) and listed[skipped:] == walked and not stop:
                res.closed = True
            elif ended_at_eos or stop:  # what follows the last batch is not a footer listing the batches
                stop = stop or "footer missing or unreadable; batches read in order"
            # else: it ends right after a complete batch (being written, or not sealed yet): not damage.
        return messages, batches, skipped, stop, schema

    def _batches(
        self,
        src: _Source,
        messages: list[_Message],
        batches: list[_Message],
        skipped: int,
        stop: str | None,
        schema: pa.Schema,
    ) -> Iterator[tuple[pa.RecordBatch, Any]]:
        """Decode the chosen batches within the file's budget; damage ends the read with its reason."""
        res = self.result
        size = res.size
        columns = self.columns
        names = list(S.SPAN_COLUMNS) if columns is None else columns
        # Only span columns are decoded, even "as written": others must not decide how much of a file is kept.
        fields = [i for i, f in enumerate(schema.names) if f in names]
        project = columns is not None or len(fields) < len(schema.names)
        wanted = _wanted_buffers(schema, fields) if project else None
        per_row = max(len(fields), len(names))
        options = pa.ipc.IpcReadOptions(included_fields=fields if project else None)
        if columns is None and project:
            self.schema = pa.schema([schema.field(i) for i in fields], metadata=schema.metadata)
        try:
            expansion = float(os.environ.get(ENV_MAX_EXPANSION) or MAX_EXPANSION)
        except ValueError:
            expansion = MAX_EXPANSION
        budget = max(MIN_BUDGET_BYTES, int(expansion * size))
        # One handle for the scan (positional reads) and pyarrow: the bytes checked are the bytes decoded.
        try:
            # Dictionaries are decoded along with the batches after them: charge them up front.
            spent = sum(_cost(src, m, None, 1) for m in messages if m.kind == _DICTIONARY)
            reader: Any = None
            use_footer = res.file_format and res.closed
            if use_footer:
                try:
                    # The whole footer schema, whatever is projected: a rotten one must fail for every column set.
                    if not pa.ipc.open_file(src).schema.equals(schema, check_metadata=True):
                        raise pa.ArrowInvalid("the footer's schema differs from the file's first message")
                    reader = pa.ipc.open_file(src, options=options)
                except Exception as exc:  # a corrupt footer: read the batches in order instead
                    use_footer, res.closed, reader = False, False, None
                    stop = stop or f"footer unreadable ({type(exc).__name__}: {exc}); batches read in order"
            if reader is None:
                src.seek(8 if res.file_format else 0)
                reader = pa.ipc.open_stream(src, options=options)
            position = messages[0].end  # where the stream reader goes on from (after a positional read, seek)
            # Without a footer batches come in order: read them all (callers filter rows anyway).
            chosen = list(range(skipped, len(batches)))
            # Batch i of an append-only file still being written is read by seeking to it (tracer.follow).
            seekable = self.expect_size is None and not any(m.kind == _DICTIONARY for m in messages)
            if self.batch_numbers is not None and (use_footer or seekable) and self.expect_size in (None, size):
                chosen = [i for i in self.batch_numbers if skipped <= i < len(batches)]
            for n, i in enumerate(chosen):
                cost = _cost(src, batches[i], wanted, per_row)
                if spent + cost > budget:
                    res.refused = (
                        f"refused batch {i} and the {len(chosen) - n - 1} batch(es) after it: decompressing it "
                        f"needs {_human(cost)} as declared, over this {_human(size)} file's budget of "
                        f"{_human(budget)} ({_human(spent)} already read; budget = max("
                        f"{_human(MIN_BUDGET_BYTES)}, {expansion:g} x size on disk)); if the file is genuine, "
                        f"raise {ENV_MAX_EXPANSION}"
                    )
                    return
                spent += cost
                try:
                    if use_footer:
                        batch, custom = reader.get_batch_with_custom_metadata(i)
                    else:
                        src.seek(batches[i].offset if seekable else position)
                        batch, custom = reader.read_next_batch_with_custom_metadata()
                        position = batches[i].end
                    # Full validation: a flipped byte in an offsets buffer must not reach to_pylist.
                    batch.validate(full=True)
                    out = batch if columns is None else conform(batch, names)
                except Exception as exc:  # whatever a corrupt batch makes pyarrow raise, it is damage here
                    res.damage = f"batch {i}: {type(exc).__name__}: {exc}"
                    return
                res.batches += 1
                res.rows += out.num_rows
                yield out, custom
            if stop:
                res.damage = stop
        except _CorruptError as exc:
            res.damage = str(exc)
        except Exception as exc:  # opening the stream: as damaged as the rest
            res.damage = f"{type(exc).__name__}: {exc}"


def read_batches(
    path: str | os.PathLike[str],
    columns: Iterable[str] | None = None,
    batch_numbers: Iterable[int] | None = None,
    expect_size: int | None = None,
    resume: tuple[int, int] | None = None,
    trust_footer: bool = False,
) -> TraceFileBatches:
    """The record batches of one trace file (a local path or a URI), as far as they can be read safely; nothing raises
    for a damaged file. ``columns``: span columns to return, conformed to :data:`tracer.schema.SPAN_SCHEMA` (missing
    ones as nulls); None: every span column the file has, as written, with each batch's custom metadata.
    ``batch_numbers``: read only these batches, if the file has ``expect_size`` (else every batch). ``resume``:
    ``(FileRead.end, FileRead.batches_in_file)`` of an earlier read of this append-only file: return only later
    batches (numbering unchanged; ignored when it does not fit). ``trust_footer``: find ``batch_numbers`` by the footer
    (its shard index vouches for it). After iterating, ``result`` says what was kept, damaged, skipped or refused."""
    cols = None if columns is None else list(columns)
    unknown = [c for c in cols or () if c not in S.SPAN_COLUMNS]
    if unknown:
        raise ValueError(f"unknown column(s) {', '.join(unknown)}; columns are {', '.join(S.SPAN_COLUMNS)}")
    chosen = None if batch_numbers is None else sorted(set(batch_numbers))
    return TraceFileBatches(os.fspath(path), cols, chosen, expect_size, resume, trust_footer)


def read_schema(path: str | os.PathLike[str]) -> pa.Schema:
    """The schema (with metadata) of a trace file, stream or IPC file (OSError: missing, empty or not Arrow)."""
    file = os.fspath(path)
    reading = read_batches(file, [])
    src = reading._open()
    if src is None:
        raise OSError(f"{file}: {reading.result.skipped}")
    with src:
        try:
            return _first_schema(src, _start(src), reading.result.size)[1]
        except (_TornError, _CorruptError, pa.ArrowException) as exc:
            raise OSError(f"{file}: not a readable trace file: {exc}") from None


def major_version(version: str) -> int:
    """The major number of a schema version (``"1.0"`` -> 1; -1 when unreadable)."""
    try:
        return int(version.split(".", 1)[0])
    except ValueError:
        return -1


def write_replacing(target: str, tmp: str, write: Callable[[BinaryIO], object]) -> None:
    """Write ``target`` whole or not at all: ``write`` fills ``tmp``, which is fsynced and renamed over ``target``
    (removed on any failure, which is raised)."""
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
