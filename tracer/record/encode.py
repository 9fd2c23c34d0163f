"""Captured values -> JSON-ready data on the writer thread: :class:`Encoder` walks each record once, cuts token id
fields to ``max_tokens`` and queues them, then decodes them per tokenizer in one batch, texts beside the ids.
"""

from __future__ import annotations

import array
import base64
import dataclasses
import functools
import json
import math
import traceback
from collections.abc import Sequence
from typing import Any

import orjson

from tracer.record.capture import NON_NEGATIVE_INTS, NOT_INTS, ObjectSnapshot, Placeholder, int_kind, safe_repr
from tracer.record.pieces import PieceTable, batch_decode, piece_table
from tracer.record.redact import REDACTED, Redactor, is_secret_key
from tracer.schema import ATTR_TOKENS, ATTR_TRUNCATED
from tracer.summary import text_field_name, token_offsets_field_name, token_texts_field_name

#: Field names that hold token ids (verl's names plus common ones).
DEFAULT_TOKEN_FIELDS = ("prompt_ids", "response_ids", "token_ids", "input_ids", "output_ids")

#: Token fields of the prompt side: decoded whole only. Every other field also gets per-token texts
#: (``*_token_offsets``, or ``*_token_texts`` when they do not spell the text; see tracer/record/pieces.py).
PROMPT_TOKEN_FIELDS = frozenset({"prompt_ids", "input_ids"})

#: Element types of lists copied to JSON as they are (ints beyond 64 bits: the json module in to_json).
_FLAT_SCALARS = frozenset({int, str, bool, type(None)})

_JSON_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


@dataclasses.dataclass(slots=True, eq=False)
class DecodeJob:
    """One token id list waiting to be decoded into ``container[key]`` (and per token, see ``piece_keys``)."""

    ids: Sequence[int]
    container: dict[str, Any]
    key: str
    tokenizer: Any
    #: Index of the job's record in the batch (its decoded text joins the record's strings).
    record: int
    #: No id is negative (a negative index would wrap in the tables).
    non_negative: bool
    #: Where each token's own text and each token's end in the text go (response-side fields only), or None.
    piece_keys: tuple[str, str] | None


class Encoder:
    """Turns captured values into JSON-ready data, queueing token work (``max_tokens`` cuts id lists)."""

    def __init__(
        self,
        token_fields: tuple[str, ...],
        token2text: bool,
        max_tokens: int | None,
        store_full_token: bool,
        redact_keys: bool = True,
    ) -> None:
        self.token_fields = frozenset(DEFAULT_TOKEN_FIELDS) | frozenset(token_fields)
        self.token2text = token2text
        self.max_tokens = max_tokens
        self.store_full_token = store_full_token
        self.redact_keys = redact_keys
        self.jobs: list[DecodeJob] = []
        #: Jobs whose per-token texts were written (see redact_pieces).
        self.piece_jobs: list[DecodeJob] = []
        #: Per record: every string value and key in its JSON (the secret scan reads these, not the JSON).
        self.strings: list[list[str]] = []
        #: Records holding text not seen as a string value (reprs): their JSON is always scanned whole.
        self.opaque: set[int] = set()
        self._cur: list[str] = []
        #: Containers whose id lists are dropped after decoding.
        self._drop_ids: list[tuple[dict[str, Any], str]] = []
        #: Set while walking a captured value (see prepare_captured).
        self._captured = False

    def begin_record(self) -> None:
        """Start collecting the next record's strings."""
        self._cur = []
        self.strings.append(self._cur)

    def prepare_captured(self, value: Any, tokenizer: Any, meta: dict[str, Any]) -> Any:
        """:meth:`prepare` for a value ``capture`` returned: its exact tuples are taken as checked ids."""
        self._captured = True
        try:
            if type(value) is dict:  # a call's bound arguments, most outputs: what prepare() does for a dict
                return self._prepare_dict(value, tokenizer, meta, "", 0)
            return self.prepare(value, tokenizer, meta)
        finally:
            self._captured = False

    def prepare(self, value: Any, tokenizer: Any, meta: dict[str, Any], path: str = "", depth: int = 0) -> Any:
        """Return ``value`` as JSON-ready data; note truncations in ``meta``."""
        cls = type(value)
        if cls is str:
            self._cur.append(value)
            return value
        if cls is int or cls is bool or value is None:
            if cls is int and not -(2**63) <= value < 2**63:
                return str(value)
            return value
        if cls is float:  # JSON has no NaN/inf: a marked placeholder, never the plain text "nan"
            return value if math.isfinite(value) else f"<{value!r}>"
        if depth > 64:
            return "<nested too deep>"
        if cls is dict or isinstance(value, dict):
            return self._prepare_dict(value, tokenizer, meta, path, depth)
        if cls is list or cls is tuple or isinstance(value, (list, tuple, set, frozenset)):
            if cls is tuple and self._captured:
                return value  # checked ids (see prepare_captured); orjson writes a tuple as a list
            if (cls is tuple or cls is list) and value and int_kind(value):
                return value
            kinds = set(map(type, value))
            if kinds <= _FLAT_SCALARS or (kinds == {float} and _all_finite(value)):  # ids, texts, logprobs
                if str in kinds:
                    self._cur.extend(v for v in value if type(v) is str)
                return value if cls is list else list(value)
            return [self.prepare(v, tokenizer, meta, path, depth + 1) for v in value]
        if isinstance(value, Placeholder):
            self._cur.append(value.text)
            return value.text
        if cls is ObjectSnapshot:
            return self.prepare({"__type__": value.type_name, **value.attrs}, tokenizer, meta, path, depth + 1)
        captured, self._captured = self._captured, False  # what follows was not captured as it is
        try:
            module = cls.__module__
            if cls is array.array or module.split(".")[0] == "numpy" or (module, cls.__name__) == ("torch", "Tensor"):
                try:
                    return self.prepare(value.tolist(), tokenizer, meta, path, depth + 1)
                except Exception:
                    return self._opaque(safe_repr(value))
            if isinstance(value, (bytes, bytearray, memoryview)):
                raw = bytes(value)
                try:
                    return self.prepare(raw.decode("utf-8"), tokenizer, meta, path, depth)
                except UnicodeDecodeError:
                    return {"__bytes_b64__": base64.b64encode(raw).decode("ascii")}
            if isinstance(value, float):
                return float(value) if math.isfinite(value) else f"<{float(value)!r}>"
            if isinstance(value, int):
                return int(value)
            if isinstance(value, BaseException):
                return self.prepare({"__type__": cls.__name__, "message": str(value)}, tokenizer, meta, path, depth)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                fields = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
                return self.prepare({"__type__": cls.__name__, **fields}, tokenizer, meta, path, depth + 1)
            return self._opaque(safe_repr(value))
        finally:
            self._captured = captured

    def _prepare_dict(self, value: Any, tokenizer: Any, meta: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        cur = self._cur
        redact_keys = self.redact_keys
        token_fields = self.token_fields
        for k, v in value.items():
            key = k if isinstance(k, str) else str(k)
            cur.append(key)
            if redact_keys and is_secret_key(key):
                out[key] = REDACTED
                continue
            vcls = type(v)
            # An llm span's common value shapes, without a call each.
            if vcls is str:
                cur.append(v)
                out[key] = v
                continue
            if (
                (vcls is float and math.isfinite(v))
                or (vcls is int and _INT64_MIN <= v <= _INT64_MAX)
                or vcls is bool
                or v is None
            ):
                out[key] = v
                continue
            if vcls is dict and depth < 64:
                out[key] = self._prepare_dict(v, tokenizer, meta, f"{path}{key}.", depth + 1)
                continue
            if vcls is tuple and self._captured:
                if key in token_fields:
                    self._put_tokens(out, key, v, True, tokenizer, meta, f"{path}{key}")
                else:
                    out[key] = v
                continue
            if key in token_fields:
                ids, kind = _as_id_list(v)
                if ids is not None:
                    self._put_tokens(out, key, ids, kind == NON_NEGATIVE_INTS, tokenizer, meta, f"{path}{key}")
                    continue
            out[key] = self.prepare(v, tokenizer, meta, f"{path}{key}.", depth + 1)
        return out

    def _opaque(self, text: str) -> str:
        self.opaque.add(len(self.strings) - 1)
        return text

    def _put_tokens(
        self,
        out: dict[str, Any],
        key: str,
        ids: Sequence[int],
        non_negative: bool,
        tokenizer: Any,
        meta: dict[str, Any],
        path: str,
    ) -> None:
        meta.setdefault(ATTR_TOKENS, {})[path] = len(ids)
        if self.max_tokens is not None and len(ids) > self.max_tokens:
            meta.setdefault(ATTR_TRUNCATED, {})[path] = len(ids)
            ids = ids[: self.max_tokens]
        out[key] = ids
        if self.token2text and tokenizer is not None:
            text_key, piece_keys = _field_names(key)
            self.jobs.append(DecodeJob(ids, out, text_key, tokenizer, len(self.strings) - 1, non_negative, piece_keys))
            if not self.store_full_token:
                self._drop_ids.append((out, key))

    def decode_pending(self) -> int:
        """Decode every queued token list per tokenizer (piece table where exact, else batch_decode); return errors."""
        errors = 0
        by_tok: dict[int, list[DecodeJob]] = {}
        for job in self.jobs:
            by_tok.setdefault(id(job.tokenizer), []).append(job)
        for jobs in by_tok.values():
            tok = jobs[0].tokenizer
            try:
                table: PieceTable | None = piece_table(tok)
            except Exception:
                errors += 1
                table = None
            try:
                if table is not None and table.exact_text and all(j.non_negative for j in jobs):
                    texts = [table.decode(j.ids, checked=True) for j in jobs]
                else:
                    texts = batch_decode(tok, [list(j.ids) for j in jobs])
            except Exception:
                errors += 1
                texts = []
                for j in jobs:
                    try:
                        texts.append(batch_decode(tok, [list(j.ids)])[0])
                    except Exception:
                        texts.append("<token2text failed for these ids>")
            for job, text in zip(jobs, texts):
                job.container[job.key] = text
                strings = self.strings[job.record]
                strings.append(text)
                if job.piece_keys is None or table is None:
                    continue
                pieces_key, ends_key = job.piece_keys
                try:
                    ends = table.ends(job.ids, tok, text, checked=job.non_negative)
                    pieces = None if ends is not None else table.pieces(job.ids, tok, checked=job.non_negative)
                except Exception:
                    errors += 1
                    continue
                self.piece_jobs.append(job)
                if pieces is None:
                    job.container[ends_key] = ends
                else:
                    job.container[pieces_key] = pieces
                    if "".join(pieces) != text:  # the secret scan sees what the pieces spell
                        strings.append("".join(pieces))
        for container, key in self._drop_ids:
            container.pop(key, None)
        self.jobs, self._drop_ids = [], []
        return errors

    def redact_pieces(self, redactor: Redactor, flags: list[bool]) -> set[int]:
        """Redact each decoded text once with its per-token texts, where ``flags`` says; returns the ids of the texts
        redacted with their offsets (for :meth:`Redactor.value`'s ``done``)."""
        done: set[int] = set()
        for job in self.piece_jobs:
            if not flags[job.record]:
                continue
            container = job.container
            assert job.piece_keys is not None  # a piece job
            pieces_key, ends_key = job.piece_keys
            ends = container.get(ends_key)
            if ends is not None:
                text, container[ends_key] = redactor.text_and_ends(container[job.key], ends)
                container[job.key] = text
                done.add(id(text))
            else:
                container[pieces_key] = redactor.pieces(container[pieces_key])
        return done


#: Ints JSON readers take as they are (prepare() writes larger ones as text).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@functools.cache
def _field_names(key: str) -> tuple[str, tuple[str, str] | None]:
    """Token field -> its text's field, and its per-token texts' and their ends' fields (None: prompt side)."""
    prompt = key in PROMPT_TOKEN_FIELDS
    return text_field_name(key), None if prompt else (token_texts_field_name(key), token_offsets_field_name(key))


def _all_finite(values: Sequence[float]) -> bool:
    """No NaN or infinity among ``values`` (floats): their sum is finite (an overflow says False too)."""
    try:
        return math.isfinite(sum(values))
    except OverflowError:
        return False


def _as_id_list(value: Any) -> tuple[Sequence[int] | None, int]:
    """``value`` as a flat id sequence if it is one (a list or tuple as it is), and its :func:`int_kind`."""
    cls = type(value)
    if cls is not list and cls is not tuple:
        module = cls.__module__
        flat = cls is array.array or module == "numpy" or (module == "torch" and cls.__name__ == "Tensor")
        try:
            value = value.tolist() if flat and getattr(value, "ndim", 1) == 1 else None
        except Exception:
            value = None
        if type(value) is not list:
            return None, NOT_INTS
    kind = int_kind(value)
    return (None if kind == NOT_INTS else value), kind


def to_json(value: Any) -> str:
    """JSON text of prepared data; never raises."""
    try:
        return orjson.dumps(value, option=_JSON_OPTS, default=safe_repr).decode("utf-8")
    except Exception:
        try:
            return json.dumps(value, default=safe_repr)  # ensure_ascii escapes lone surrogates, which orjson refuses
        except Exception as exc:
            return orjson.dumps(f"<unencodable: {type(exc).__name__}>").decode("utf-8")


def error_fields(exc: BaseException) -> dict[str, str]:
    """An exception's type, message and formatted traceback (``exc`` captured: formatting runs no user code)."""
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ in ("builtins", "__main__") else f"{cls.__module__}.{cls.__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = "<str() of the exception failed>"
    try:
        tb = "".join(traceback.format_exception(cls, exc, exc.__traceback__))
    except Exception:
        tb = ""
    return {"type": name, "message": message, "traceback": tb}
