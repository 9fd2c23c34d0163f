"""Per-token text for token2text: a table from token id to its text and bytes, built once per tokenizer.

A sequence's pieces are a list lookup and its text a join of bytes (~27 M tokens/s against ~11.6 M for
``decode_batch``); rendering is documented in ``docs/format.md``. :func:`token_texts_of` reads back a span's
token ends in its text (``*_token_offsets``) or, where the pieces do not spell it, the pieces (``*_token_texts``).
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import random
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

#: Largest vocabulary built eagerly into a table (ids past it are decoded on demand).
MAX_TABLE_IDS = 1 << 20
#: Sequences at least this long are decoded by one numpy gather of the table's bytes (3x a join at 2,048 ids).
NUMPY_DECODE_IDS = 256
#: Random sequences decoded both ways to check the table reproduces the tokenizer's text.
CHECK_SEQUENCES = 32
#: Length of each check sequence.
CHECK_LENGTH = 48

_tables: weakref.WeakKeyDictionary[Any, PieceTable] = weakref.WeakKeyDictionary()
_tables_by_id: dict[int, tuple[Any, PieceTable]] = {}
_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character standing for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in keep]  # shown as the characters from 256 on, in byte order
    return {chr(c): b for b, c in zip(keep + moved, keep + list(range(256, 256 + len(moved))))}


def batch_decode(tokenizer: Any, sequences: list[list[int]]) -> list[str]:
    """Decode many id lists with whatever decode API ``tokenizer`` has (a fast one's Rust backend when exact)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return list(backend.decode_batch(sequences, skip_special_tokens=False))
    fn = getattr(tokenizer, "batch_decode", None)
    if fn is not None:
        return list(fn(sequences, skip_special_tokens=False))
    fn = getattr(tokenizer, "decode_batch", None)  # tokenizers.Tokenizer
    if fn is not None:
        return list(fn(sequences, skip_special_tokens=False))
    return [tokenizer.decode(s) for s in sequences]


class PieceTable:
    """Each token id's text (and bytes, for byte-level BPE) for one tokenizer (no reference to it is kept)."""

    def __init__(self, tokenizer: Any) -> None:
        #: id -> text of that token alone; None where it is part of a character (byte-level).
        self.texts: list[str | None] = []
        #: id -> its bytes (byte-level BPE only), else empty.
        self.bytes: list[bytes] = []
        #: True when joining ``bytes`` reproduces the tokenizer's decoded text (checked on samples).
        self.exact_text = False
        self._extra: dict[int, str] = {}
        #: id -> characters in its text, -1 where the text is None (built on first use).
        self._lengths: np.ndarray | None = None
        #: ``bytes`` joined, where each id's bytes start in it, their lengths (built on first use).
        self._joined: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        #: id(ids) -> (ids, their array) of the sequences decoded since :meth:`ends` last ran, for it to reuse.
        self._arrays: dict[int, tuple[Sequence[int], np.ndarray]] = {}
        self._ends_ran = False
        # The tokenizers.Tokenizer under a transformers fast tokenizer, or the tokenizer itself if it is one.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None and callable(getattr(tokenizer, "id_to_token", None)):
            backend = tokenizer
        if backend is None or not callable(getattr(backend, "get_vocab_size", None)):
            return
        n = int(backend.get_vocab_size(with_added_tokens=True))
        if not 0 < n <= MAX_TABLE_IDS:
            return
        added = {int(i): t.content for i, t in backend.get_added_tokens_decoder().items()}
        raw = self._byte_level_bytes(backend, n, added)
        if raw is not None:
            self.use_bytes(raw)
            rng = random.Random(0)  # random sequences decoded both ways: does the table reproduce the tokenizer?
            seqs = [[rng.randrange(n) for _ in range(CHECK_LENGTH)] for _ in range(CHECK_SEQUENCES)]
            with contextlib.suppress(Exception):
                self.exact_text = batch_decode(tokenizer, seqs) == [self.decode(s) for s in seqs]
            if self.exact_text:
                return
            self.bytes = []
        # Any other decoder: each id decoded alone (special tokens kept).
        self.texts = list(batch_decode(tokenizer, [[i] for i in range(n)]))

    def use_bytes(self, raw: list[bytes]) -> None:
        """Take ``raw`` as each id's bytes, and each id's text where its bytes are whole UTF-8 (else None)."""
        self.bytes = raw
        texts: list[str | None] = []
        for b in raw:
            try:
                texts.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(None)
        self.texts = texts

    @staticmethod
    def _byte_level_bytes(backend: Any, n: int, added: dict[int, str]) -> list[bytes] | None:
        from tokenizers import decoders

        if not isinstance(backend.decoder, decoders.ByteLevel):
            return None
        table = _byte_decoder()
        try:  # a character outside the byte alphabet: not byte-level after all
            return [
                added[i].encode("utf-8") if i in added else bytes(table[c] for c in backend.id_to_token(i) or "")
                for i in range(n)
            ]
        except KeyError:
            return None

    def decode(self, ids: Sequence[int], checked: bool = False) -> str:
        """The sequence's text from the byte table (when :attr:`exact_text`); IndexError outside it or for a negative
        id (``checked``: the caller knows there is none)."""
        if not checked and ids and min(ids) < 0:
            raise IndexError(f"negative token id {min(ids)}")
        if len(ids) < NUMPY_DECODE_IDS:
            return b"".join(map(self.bytes.__getitem__, ids)).decode("utf-8", "replace")
        import numpy as np

        if self._joined is None:
            lengths = np.fromiter(map(len, self.bytes), np.int64, len(self.bytes))
            starts = np.zeros(len(lengths), np.int64)
            np.cumsum(lengths[:-1], out=starts[1:])
            self._joined = (np.frombuffer(b"".join(self.bytes), np.uint8), starts, lengths)
        joined, starts, lengths = self._joined
        arr = np.fromiter(ids, np.int64, len(ids))
        if int(arr.max()) >= len(lengths):
            raise IndexError(f"token id {int(arr.max())} outside the table")
        if self._ends_ran:  # a new batch: the last one's arrays go
            self._ends_ran = False
            self._arrays.clear()
        self._arrays[id(ids)] = (ids, arr)
        n = lengths[arr]
        ends = np.cumsum(n)
        # Byte k of the output is byte (k - where its token starts in the output) of that token's bytes.
        index = np.arange(int(ends[-1])) + np.repeat(starts[arr] - (ends - n), n)
        return joined[index].tobytes().decode("utf-8", "replace")

    def pieces(self, ids: Sequence[int], tokenizer: Any, checked: bool = False) -> list[str]:
        """One text per token of ``ids`` (``checked``: the caller knows no id is negative)."""
        texts = self.texts
        try:
            if not checked and ids and min(ids) < 0:
                raise IndexError
            out = list(map(texts.__getitem__, ids))
        except IndexError:  # ids outside the table (or a tokenizer without one)
            out = self._slow(ids, tokenizer)
        if None in out and not self.bytes:
            out = self._slow(ids, tokenizer)
        elif None in out:  # byte-level: a character split over tokens shows in its last byte's token
            table, total, k = self.bytes, len(ids), 0
            while k < total:
                if out[k] is not None:
                    k += 1
                    continue
                dec = codecs.getincrementaldecoder("utf-8")("replace")
                while k < total:
                    i = ids[k]
                    out[k] = dec.decode(table[i] if 0 <= i < len(table) else b"")
                    k += 1
                    if not dec.getstate()[0] and (k >= total or out[k] is not None):
                        break
                tail = dec.decode(b"", final=True)
                if tail:
                    out[k - 1] = (out[k - 1] or "") + tail
        return out  # type: ignore[return-value]

    def ends(self, ids: Sequence[int], tokenizer: Any, text: str, checked: bool = False) -> np.ndarray | None:
        """Where each token of ``ids`` ends in ``text`` (characters), or None when its pieces do not spell ``text``."""
        import numpy as np

        n = len(ids)
        if n == 0:
            return np.zeros(0, dtype=np.int64) if text == "" else None
        if self.exact_text:
            lengths = self._lengths
            if lengths is None:
                lengths = self._lengths = np.fromiter((-1 if t is None else len(t) for t in self.texts), np.int64)
            self._ends_ran = True
            kept = self._arrays.pop(id(ids), None)
            try:
                arr = kept[1] if kept is not None and kept[0] is ids else np.fromiter(ids, np.int64, n)
            except (OverflowError, TypeError, ValueError):
                arr = None
            if arr is not None and (checked or int(arr.min()) >= 0) and int(arr.max()) < len(lengths):
                per = lengths[arr]
                if int(per.min()) >= 0:
                    out = np.cumsum(per)
                    return out if int(out[-1]) == len(text) else None
        pieces = self.pieces(ids, tokenizer, checked)
        return np.cumsum(np.fromiter(map(len, pieces), np.int64, n)) if "".join(pieces) == text else None

    def _slow(self, ids: Sequence[int], tokenizer: Any) -> list[str | None]:
        texts, extra = self.texts, self._extra
        missing = [i for i in dict.fromkeys(ids) if not 0 <= i < len(texts) and i not in extra]
        if missing:
            try:
                decoded = batch_decode(tokenizer, [[i] for i in missing])
            except Exception:
                decoded = ["\ufffd"] * len(missing)
            if len(extra) > MAX_TABLE_IDS:
                extra.clear()
            extra.update(zip(missing, decoded))
        return [texts[i] if 0 <= i < len(texts) else extra[i] for i in ids]


def piece_table(tokenizer: Any) -> PieceTable:
    """The (cached) table of ``tokenizer``: built on first use, kept while the tokenizer lives."""
    with _lock:
        try:
            table = _tables.get(tokenizer)
        except TypeError:  # not weak-referenceable: keep it by id with a reference
            hit = _tables_by_id.get(id(tokenizer))
            table = hit[1] if hit is not None and hit[0] is tokenizer else None
        if table is not None:
            return table
    table = PieceTable(tokenizer)
    with _lock:
        try:
            _tables[tokenizer] = table
        except TypeError:
            if len(_tables_by_id) > 8:
                _tables_by_id.clear()
            _tables_by_id[id(tokenizer)] = (tokenizer, table)  # kept alive with it: a few at most
    return table


def split_text(text: str, ends: Sequence[int]) -> list[str] | None:
    """The per-token texts ``ends`` cut ``text`` into, or None when they do not fit it."""
    if not ends or type(ends[-1]) is not int or ends[-1] != len(text):
        return [] if not ends and text == "" else None
    out = []
    start = 0
    for end in ends:
        if type(end) is not int or end < start:
            return None
        out.append(text[start:end])
        start = end
    return out


def token_texts_of(outputs: Any, texts_key: str, ends_key: str, text: Any) -> list[str] | None:
    """One text per token as a span's ``outputs`` store them: the pieces or ``text`` cut at ``ends_key``."""
    texts = outputs.get(texts_key)
    if isinstance(texts, list) and all(type(x) is str for x in texts):
        return texts
    ends = outputs.get(ends_key)
    if isinstance(ends, list) and isinstance(text, str):
        return split_text(text, ends)
    return None
