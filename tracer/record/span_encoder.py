"""Span records to Arrow batches of :data:`tracer.schema.SPAN_SCHEMA` on the writer thread: arguments bound to names,
values walked into JSON, token ids decoded, secrets redacted, multi-turn prompts stored once
(:class:`HistoryTracker`), values a column cannot hold replaced by a marked placeholder.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import numbers
import os
from typing import Any

import pyarrow as pa

from tracer import schema as S
from tracer.config import TraceConfig
from tracer.record.accounting import ATTR_REPLACED, ProblemLog
from tracer.record.capture import CANCELLED, instance_attribute
from tracer.record.context import Trajectory
from tracer.record.encode import Encoder, error_fields, to_json
from tracer.record.redact import Redactor
from tracer.record.spec import OpSpec
from tracer.storage.history import HistoryTracker

# Positions in a span record tuple (built on the caller's path; SpanRecord's fields).
R_SPAN, R_PARENT, R_TRACE, R_SPEC, R_TRAJ, R_START, R_END, R_EXC, R_ARGS, R_KWARGS, R_OUT, R_SELF = range(12)

#: Characters of JSON text in one batch (an Arrow string column holds at most 2 GiB; a batch is built in memory).
BATCH_CHARS = 64 * 1024 * 1024
#: Records turned into JSON text at a time: what one chunk builds dies young; per-chunk work stays negligible.
ENCODE_CHUNK = 128
#: One value's UTF-8 bytes an Arrow string column can hold; larger ones become a marked placeholder.
MAX_VALUE_BYTES = 2**31 - 2**20


@dataclasses.dataclass
class EncodedSpans:
    """Batches in record order, values written as a marked placeholder, records not encodable at all."""

    batches: list[pa.RecordBatch]
    replaced: int = 0
    failed: int = 0


class SpanEncoder:
    """Encodes span records for one recorder's config and this process's id prefixes (``redactor`` None: off)."""

    def __init__(
        self, config: TraceConfig, problems: ProblemLog, span_prefix: str, trace_prefix: str, redactor: Redactor | None
    ) -> None:
        self.config = config
        self.problems = problems
        self.span_prefix = span_prefix
        self.trace_prefix = trace_prefix
        self.redactor = redactor
        #: Values replaced while encoding (read and reset by :meth:`encode`).
        self.replaced = 0
        #: Multi-turn prompt_ids stored once (tracer/storage/history.py).
        self.history = HistoryTracker()
        self._history_file: str | None = None
        #: The file the batches go to (history references stay within one file).
        self.file: str | None = None

    def encode(self, records: list[tuple[Any, ...]], file: str | None = None) -> EncodedSpans:
        """Encode ``records`` for ``file`` (a new file starts a new history); a failing span is retried alone."""
        self.file = file
        self.replaced = 0
        failed = 0
        try:
            batches = self.encode_batches(records)
        except Exception as exc:
            # Encode them one by one so that only the bad ones are lost (and counted).
            self.problems.report("internal error", f"encoding a batch: {type(exc).__name__}: {exc}", exc)
            self.history.clear()  # it may hold spans of the failed pass: no reference to them, nor to itself
            batches = []
            for rec in records:
                try:
                    batches.extend(self.encode_batches([rec]))
                except Exception as err:
                    failed += 1
                    self.problems.report(
                        "span not encodable", f"{rec[R_SPEC].name!r}: {type(err).__name__}: {err}", err
                    )
        return EncodedSpans(batches, self.replaced, failed)

    def tokenizer_for(self, self_obj: Any) -> Any:
        """The tokenizer for token2text: the configured one (loaded once), else ``self_obj.tokenizer`` (verl's)."""
        if not self.config.token2text:
            return None
        tok = self._configured_tokenizer
        return tok if tok is not None or self_obj is None else instance_attribute(self_obj, "tokenizer")

    @functools.cached_property
    def _configured_tokenizer(self) -> Any:
        tok = self.config.tokenizer
        if isinstance(tok, (str, os.PathLike)):
            from tracer.record.tokenizer import load_tokenizer

            try:
                return load_tokenizer(os.fspath(tok))
            except Exception as exc:
                self.problems.report("tokenizer", f"cannot load {tok!r}: {exc}", exc)
                return None
        return tok

    def encode_batches(self, records: list[tuple[Any, ...]]) -> list[pa.RecordBatch]:
        """Span records as Arrow batches of at most :data:`BATCH_CHARS` of text; a value a column cannot hold (a
        non-string name, a lone surrogate, an int beyond int64, over 2 GiB) becomes a placeholder, named in the
        span's ``rollout_trace.replaced`` and counted."""
        n = len(records)
        cols: dict[str, list[Any]] = {S.REWARD: [None] * n, S.STATUS: [S.STATUS_OK] * n, S.ERROR: [None] * n}
        cols.update({S.NAME: [None] * n, S.INPUTS: [], S.OUTPUTS: [], S.ATTRIBUTES: []})
        for lo in range(0, n, ENCODE_CHUNK):
            self._encode_chunk(records, lo, min(n, lo + ENCODE_CHUNK), cols)
        trajs: list[Trajectory | None] = [r[R_TRAJ] for r in records]
        for name in (S.STEP, S.SAMPLE_INDEX, S.ROLLOUT_N, S.VALIDATE):  # Trajectory's attributes of the same names
            cols[name] = [None if t is None else getattr(t, name) for t in trajs]
        errors = cols[S.ERROR]
        redactor = self.redactor
        if redactor is not None:
            errors = [None if e is None else redactor.value(e) for e in errors]
            cols[S.NAME] = redactor.texts(cols[S.NAME])
            cols[S.SAMPLE_INDEX] = redactor.texts(cols[S.SAMPLE_INDEX])
        cols[S.ERROR] = [None if e is None else to_json(e) for e in errors]
        sp, tp = self.span_prefix, self.trace_prefix
        cols[S.TRACE_ID] = [f"{tp}{r[R_TRACE]:016x}" if r[R_TRACE] else "" for r in records]
        cols[S.SPAN_ID] = [f"{sp}{r[R_SPAN]:08x}" for r in records]
        cols[S.PARENT_SPAN_ID] = [None if r[R_PARENT] is None else f"{sp}{r[R_PARENT]:08x}" for r in records]
        cols[S.KIND] = [r[R_SPEC].kind for r in records]
        cols[S.START_NS] = [r[R_START] for r in records]
        cols[S.END_NS] = [r[R_END] for r in records]
        slices, big = _byte_bounded_slices(cols, n)
        return [self._build_batch(cols, lo, hi, big) for lo, hi in slices]

    def _encode_chunk(self, records: list[tuple[Any, ...]], lo: int, hi: int, cols: dict[str, list[Any]]) -> None:
        """Append the JSON text of ``records[lo:hi]``'s inputs, outputs and attributes; fill those rows of the rest."""
        rewards, statuses, errors, names = cols[S.REWARD], cols[S.STATUS], cols[S.ERROR], cols[S.NAME]
        cfg = self.config
        enc = Encoder(cfg.token_fields, cfg.token2text, cfg.max_tokens, cfg.store_full_token, cfg.redact)
        prepared: list[tuple[Any, Any, dict[str, Any], bool]] = []
        tokenizer_for = self.tokenizer_for
        prepare = enc.prepare_captured  # every value of a record was captured at call time
        chunk = records[lo:hi]
        for j, rec in enumerate(chunk):
            i = lo + j
            enc.begin_record()
            spec: OpSpec = rec[R_SPEC]
            traj: Trajectory | None = rec[R_TRAJ]
            exc = rec[R_EXC]
            special = spec.special
            attrs: dict[str, Any] = {}
            inputs = outputs = None
            try:
                if special == "reward":
                    rewards[i] = rec[R_ARGS][0]
                    attrs.update(prepare(rec[R_KWARGS] or {}, None, {}))
                elif special is None:
                    tok = tokenizer_for(rec[R_SELF])
                    inputs = prepare(spec.bind(rec[R_ARGS], rec[R_KWARGS]), tok, attrs)
                    if exc is None:
                        out = rec[R_OUT]
                        outputs = prepare(out, tok, attrs)
                        if spec.kind == S.KIND_REWARD:
                            rewards[i] = as_reward(out)
                if traj is not None and rec[R_PARENT] is None and traj.extra:
                    attrs.update(prepare(traj.extra, None, {}))
            except Exception as err:
                self.problems.report("internal error", f"encoding span {spec.name!r}: {type(err).__name__}: {err}", err)
                inputs, outputs = f"<not recorded: {type(err).__name__}: {err}>", None
                enc.opaque.add(j)
            prepared.append((inputs, outputs, attrs, special is None and exc is None))
            names[i] = traj.name if special == "root" and traj is not None else spec.name
            if isinstance(exc, CANCELLED):
                statuses[i] = S.STATUS_CANCELLED
            elif exc is not None:
                statuses[i], errors[i] = S.STATUS_ERROR, error_fields(exc)
        failed = enc.decode_pending()
        if failed:
            self.problems.report("token2text", f"{failed} batch_decode call(s) failed; decoded one by one")
        redactor = self.redactor
        flags = redactor.records_to_scan(enc.strings, enc.opaque) if redactor is not None else None
        # Each decoded text with its tokens, before verl moves it.
        done = enc.redact_pieces(redactor, flags) if redactor is not None and flags is not None else set()
        for rec, (inputs, outputs, _, _) in zip(chunk, prepared):  # verl's layout: texts where verl puts them
            if rec[R_SPEC].signature is None or not isinstance(outputs, dict):
                continue
            if "prompt_text" not in outputs and isinstance(inputs, dict) and isinstance(inputs.get("prompt_text"), str):
                outputs["prompt_text"] = inputs["prompt_text"]
            if "response_text" not in outputs and isinstance(outputs.get("token_text"), str):
                outputs["response_text"] = outputs.pop("token_text")
        if redactor is not None and flags is not None:
            # Redact the strings themselves, before JSON escaping.
            clean = functools.partial(redactor.value, done=done)
            prepared = [(clean(p[0]), clean(p[1]), clean(p[2]), p[3]) if f else p for p, f in zip(prepared, flags)]
        self._store_history_once(chunk, prepared)
        cols[S.INPUTS].extend(None if p[0] is None else to_json(p[0]) for p in prepared)
        cols[S.OUTPUTS].extend(to_json(p[1]) if p[3] else None for p in prepared)
        cols[S.ATTRIBUTES].extend(to_json(p[2]) if p[2] else None for p in prepared)

    def _store_history_once(self, records: list[tuple[Any, ...]], prepared: list[tuple[Any, Any, Any, bool]]) -> None:
        """Turn each llm span's prompt_ids that extend its trajectory's last llm turn into a reference."""
        path = self.file
        if path != self._history_file:
            if self._history_file is not None:
                self.history.clear()  # references stay within one file
            self._history_file = path
        history, sp = self.history, self.span_prefix
        for rec, (inputs, outputs, _, has_outputs) in zip(records, prepared):
            trace = rec[R_TRACE]
            if not trace:
                continue
            spec: OpSpec = rec[R_SPEC]
            if spec.kind == S.KIND_LLM and spec.special is None:
                history.encode(trace, f"{sp}{rec[R_SPAN]:08x}", inputs, outputs if has_outputs else None)
            elif rec[R_PARENT] is None:
                history.end(trace)

    def _build_batch(self, cols: dict[str, list[Any]], lo: int, hi: int, big: bool = False) -> pa.RecordBatch:
        """One batch of rows ``lo:hi``; values a column refuses become placeholders."""
        arrays = []
        notes: dict[int, dict[str, str]] = {}
        for name, typ, _, _ in S.SPAN_FIELDS:
            values = cols[name][lo:hi] if (lo, hi) != (0, len(cols[name])) else cols[name]
            arr = None if big and name in _JSON_COLUMNS else _try_array(values, typ)
            if arr is None:
                values = _fit_column(name, values, typ, notes)
                arr = pa.array(values, type=typ)
            arrays.append(arr)
        if notes:
            self.replaced += sum(len(v) for v in notes.values())
            attrs = arrays[S.SPAN_COLUMNS.index(S.ATTRIBUTES)].to_pylist()
            for i, note in notes.items():
                old = json.loads(attrs[i]) if attrs[i] else {}
                old[ATTR_REPLACED] = note
                attrs[i] = to_json(old)
            arrays[S.SPAN_COLUMNS.index(S.ATTRIBUTES)] = pa.array(attrs, type=pa.string())
            self.problems.report(
                "value replaced",
                "; ".join(f"{col}: {why}" for note in notes.values() for col, why in note.items())[:500],
            )
        return pa.RecordBatch.from_arrays(arrays, schema=S.SPAN_SCHEMA)


def _try_array(values: list[Any], typ: pa.DataType) -> pa.Array | None:
    try:
        arr = pa.array(values, type=typ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError, UnicodeError):
        return None
    # Over 2 GiB of text comes back chunked: not one batch column.
    return arr if isinstance(arr, pa.Array) else None


def _fit_column(name: str, values: list[Any], typ: pa.DataType, notes: dict[int, dict[str, str]]) -> list[Any]:
    """``values`` with each one the column refuses replaced; note why per row."""
    out = list(values)
    is_text = pa.types.is_string(typ)
    for i, v in enumerate(values):
        if v is None:
            continue
        if is_text and type(v) is str:
            if len(v) * 4 > MAX_VALUE_BYTES and len(v.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES:
                out[i] = f"<not recorded: {len(v)} characters, more than a column holds ({MAX_VALUE_BYTES} bytes)>"
                notes.setdefault(i, {})[name] = f"{len(v)} characters, over {MAX_VALUE_BYTES} bytes"
                continue
            try:
                v.encode("utf-8")
                continue
            except UnicodeEncodeError:
                # Lone surrogates: written as \udXXX escapes (JSON columns never hold them).
                out[i] = v.encode("utf-8", "backslashreplace").decode("utf-8")
                notes.setdefault(i, {})[name] = "lone surrogates written as \\u escapes"
                continue
        if _try_array([v], typ) is not None:
            continue
        text = _describe(v)
        out[i] = f"<{text}>" if is_text else None
        notes.setdefault(i, {})[name] = text
    return out


def _describe(value: Any) -> str:
    try:
        text = repr(value) if type(value) in (int, float, bool, str, bytes) else f"a {type(value).__name__}"
    except Exception:
        text = f"a {type(value).__name__}"
    if isinstance(value, int):
        text = f"int {text[:40]} beyond int64"
    return f"not storable here: {text[:200]}".encode("utf-8", "backslashreplace").decode("utf-8")


_JSON_COLUMNS = frozenset({S.INPUTS, S.OUTPUTS, S.ATTRIBUTES, S.ERROR})


def _byte_bounded_slices(cols: dict[str, list[Any]], n: int) -> tuple[list[tuple[int, int]], bool]:
    """Row ranges whose JSON text stays under :data:`BATCH_CHARS`, and whether a row may pass MAX_VALUE_BYTES."""
    text_cols = [cols[name] for name in _JSON_COLUMNS]
    total = sum(sum(map(len, filter(None, c))) for c in text_cols)  # in C: the common case, one batch
    if total <= BATCH_CHARS:
        return [(0, n)], total * 4 > MAX_VALUE_BYTES
    sizes = [sum(len(c[i]) for c in text_cols if c[i] is not None) for i in range(n)]
    big = bool(sizes) and max(sizes) * 4 > MAX_VALUE_BYTES
    out: list[tuple[int, int]] = []
    lo, acc = 0, 0
    for i, size in enumerate(sizes):
        if i > lo and acc + size > BATCH_CHARS:
            out.append((lo, i))
            lo, acc = i, 0
        acc += size
    out.append((lo, n))
    return out, big


def as_reward(value: Any) -> float | None:
    """A reward op's return as a float (None when it is no real number)."""
    try:
        return float(value) if isinstance(value, numbers.Real) else None
    except (TypeError, ValueError):
        return None
