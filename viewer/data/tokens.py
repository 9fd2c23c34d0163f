"""The token view's data: each llm turn's tokens, logprobs and text, and the trainer's per-token stats."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

import tracer
from tracer.extras import install_command

# Column names, kinds, statuses and attribute keys come from tracer's schema, never spelled here.
from tracer.record.pieces import piece_table
from tracer.record.token_stats import TOKEN_STATS_SPAN_NAME
from tracer.schema import META_CONFIG, ROLLOUT_N, SAMPLE_INDEX, STEP, TRACE_ID, VALIDATE
from tracer.summary import (
    ADVANTAGES,
    ENTROPY,
    LOSS_MASK,
    ROLLOUT_LOGPROBS,
    TOKEN_STATS_KEY_COLUMNS,
    TOKEN_STATS_SOURCE,
    TRAINER_LOGPROBS,
    TURN,
    span_turns,
)
from viewer.data.runs import Loaded, _reading

#: Tokens per row of the token grid.
TOKENS_PER_ROW = 12
#: Characters of a token the grid cell shows (the tooltip shows all of it).
CELL_CHARS = 10

#: The colourings the token view offers besides the recorded arrays: label -> cell field.
COLOR_LOGPROB = "logprob"
COLOR_MISMATCH = "mismatch"
#: Cell field: rollout logprob minus trainer logprob.
MISMATCH = "mismatch"
#: Cell field: False where the loss mask is 0 (the token is not trained on).
IN_LOSS = "in_loss"


@dataclass
class TokenTurn:
    """The response tokens of one llm span, for the token view.

    ``stats`` are the trainer's per-token arrays for this turn
    (:func:`tracer.log_token_stats`), by name.
    """

    name: str
    index: int
    token_ids: list[int] | None
    token_texts: list[str] | None
    logprobs: list[float | None] | None
    text: str | None
    recorded: int | None  # tokens the engine produced (before truncation)
    truncated: bool
    finish_reason: str | None
    prompt_tokens: int | None
    stats: dict[str, list[float | None]] = field(default_factory=dict)
    stats_source: str | None = None

    @property
    def kept(self) -> int:
        """Tokens kept in the record."""
        if self.token_ids is not None:
            return len(self.token_ids)
        if self.token_texts is not None:
            return len(self.token_texts)
        return 0

    def color_fields(self) -> list[str]:
        """What the grid can be coloured by: logprob, the rollout-vs-trainer difference, each recorded array."""
        out = [COLOR_LOGPROB] if self.logprobs is not None else []
        if self.logprobs is not None and self.stats.get(TRAINER_LOGPROBS) is not None:
            out.append(COLOR_MISMATCH)
        out += [k for k in self.stats if k not in (ROLLOUT_LOGPROBS, LOSS_MASK)]
        return out

    def cells(self, per_row: int = TOKENS_PER_ROW) -> list[dict[str, Any]]:
        """One cell per token for the token grid: row, column, label, id, logprob, probability, stats."""
        n = self.kept or (len(self.logprobs) if self.logprobs else 0)
        trainer = self.stats.get(TRAINER_LOGPROBS)
        mask = self.stats.get(LOSS_MASK)
        cells = []
        for i in range(n):
            tid = _at(self.token_ids, i)
            text = _at(self.token_texts, i)
            lp = _at(self.logprobs, i)
            label = text if text is not None else (str(tid) if tid is not None else "?")
            old = _at(trainer, i)
            m = _at(mask, i)
            cell: dict[str, Any] = {
                "pos": i,
                "row": i // per_row,
                "col": i % per_row,
                "label": _visible(label)[:CELL_CHARS],
                "token": _visible(label),
                "token_id": tid,
                COLOR_LOGPROB: lp,
                "prob": math.exp(lp) if isinstance(lp, (int, float)) else None,
                MISMATCH: (lp - old) if isinstance(lp, (int, float)) and isinstance(old, (int, float)) else None,
                IN_LOSS: True if m is None else bool(m),
            }
            for name, values in self.stats.items():
                if name not in cell:
                    cell[name] = _at(values, i)
            cells.append(cell)
        return cells

    @property
    def synthetic(self) -> bool:
        """The trainer stats were made up (``source`` says synthetic), not measured by a trainer."""
        return bool(self.stats_source) and "synthetic" in str(self.stats_source).lower()

    def token_rows(self, advantage: float | None = None) -> list[dict[str, Any]]:
        """One row per token: the columns of :data:`TOKEN_TABLE_COLUMNS`.

        ``advantage`` is the trajectory's, used where no per-token
        ``advantages`` were logged. The ratio is ``exp(trainer - rollout)``,
        its exponent clamped at :data:`MAX_LOG_RATIO`.
        """
        rows = []
        for c in self.cells():
            lp, old = c[COLOR_LOGPROB], c.get(TRAINER_LOGPROBS)
            adv = c.get(ADVANTAGES, advantage)
            rows.append(
                {
                    "pos": c["pos"],
                    "token": c["token"],
                    ROLLOUT_COL: lp,
                    TRAINER_COL: old,
                    DIFF_COL: c[MISMATCH],
                    RATIO_COL: math.exp(min(old - lp, MAX_LOG_RATIO))
                    if isinstance(lp, (int, float)) and isinstance(old, (int, float))
                    else None,
                    ENTROPY: c.get(ENTROPY),
                    ADVANTAGES_COL: adv,
                    LOSS_MASK: int(c[IN_LOSS]),
                }
            )
        return rows

    def mismatch(self) -> tuple[float | None, int]:
        """Mean ``|rollout logprob - trainer logprob|`` over tokens in the loss mask, and how many were counted."""
        diffs = [abs(c[MISMATCH]) for c in self.cells() if c[IN_LOSS] and isinstance(c[MISMATCH], (int, float))]
        return (sum(diffs) / len(diffs) if diffs else None), len(diffs)


#: Columns of the per-token table (besides ``pos`` and ``token``).
ROLLOUT_COL = "rollout logprob"
TRAINER_COL = "trainer logprob"
DIFF_COL = "difference"
RATIO_COL = "ratio"
ADVANTAGES_COL = "advantage"
TOKEN_TABLE_COLUMNS = (
    "pos",
    "token",
    ROLLOUT_COL,
    TRAINER_COL,
    DIFF_COL,
    RATIO_COL,
    ENTROPY,
    ADVANTAGES_COL,
    LOSS_MASK,
)
#: exp() above this overflows a float: the ratio's exponent is clamped there.
MAX_LOG_RATIO = 700.0
#: Cell colours: light (good, or small) to dark (bad, or large); masked cells grey.
_LIGHT, _DARK, _MASKED_BG, _MASKED_INK = (255, 247, 188), (153, 0, 13), "#eeeeee", "#8a8a8a"
#: Where each colouring is darkest: a logprob this low, a |difference| this big (others: the turn's largest).
_DARKEST = {COLOR_LOGPROB: 5.0, COLOR_MISMATCH: 1.0}


def _ink(rgb: tuple[int, int, int]) -> str:
    """Black or white text, whichever contrasts more with ``rgb`` (WCAG relative luminance)."""

    def lin(c: int) -> float:
        x = c / 255
        return x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4

    lum = 0.2126 * lin(rgb[0]) + 0.7152 * lin(rgb[1]) + 0.0722 * lin(rgb[2])
    return "#000000" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "#ffffff"


def paint(cells: list[dict[str, Any]], color_by: str | None) -> list[dict[str, Any]]:
    """Give each cell a background (``bg``) from its ``color_by`` value and a text colour (``ink``) legible on it."""
    values = [c.get(color_by) if color_by else None for c in cells]
    nums = [abs(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    darkest = _DARKEST.get(color_by or "", max(nums, default=0.0)) or 1.0
    for c, v in zip(cells, values, strict=True):
        if not c[IN_LOSS]:
            c["bg"], c["ink"] = _MASKED_BG, _MASKED_INK
            continue
        t = min(1.0, abs(v) / darkest) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0
        r, g, b = (round(lo + (hi - lo) * t) for lo, hi in zip(_LIGHT, _DARK, strict=True))
        c["bg"] = f"#{r:02x}{g:02x}{b:02x}"
        c["ink"] = _ink((r, g, b))
    return cells


def _rollout_logprobs(recorded: Any, stats: dict[str, Any]) -> list[float | None] | None:
    """The turn's own logprobs; where the engine gave none, the ``rollout_logprobs`` the trainer logged."""
    if recorded is not None:
        return list(recorded)
    logged = stats.get(ROLLOUT_LOGPROBS)
    return list(logged) if logged is not None else None


def _at(values: Any, i: int) -> Any:
    return values[i] if values is not None and i < len(values) else None


def worst_tokens(turn: TokenTurn, by: str = COLOR_MISMATCH, n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` tokens of a turn with the largest ``|by|`` (the mismatch) or lowest logprob, masked ones last."""
    cells = [c for c in turn.cells() if isinstance(c.get(by), (int, float))]
    if by == COLOR_LOGPROB:
        cells.sort(key=lambda c: (not c[IN_LOSS], c[by]))
    else:
        cells.sort(key=lambda c: (not c[IN_LOSS], -abs(c[by])))
    keep = ("pos", "token", "token_id", COLOR_LOGPROB, MISMATCH, IN_LOSS, *turn.stats)
    return [{k: c.get(k) for k in dict.fromkeys(keep)} for c in cells[:n]]


def turn_stats(token_stats: pa.Table, trace_id: str, key: tuple[Any, Any, Any, Any] | None = None) -> dict[int, dict]:
    """A trajectory's per-turn arrays from :func:`tracer.read_token_stats`: turn -> {name: values}.

    Rows logged with the trajectory's trace id come first; rows logged
    outside it (no trace id) join by ``key`` = (step, sample_index, rollout_n, validate).
    """
    arrays = [c for c in token_stats.column_names if c not in TOKEN_STATS_KEY_COLUMNS]
    out: dict[int, dict[str, Any]] = {}
    rows = token_stats.to_pylist()
    keyed = [
        r
        for r in rows
        if r[TRACE_ID] is None
        and key is not None
        and (r[STEP], r[SAMPLE_INDEX], r[ROLLOUT_N], bool(r[VALIDATE])) == (key[0], key[1], key[2], bool(key[3]))
    ]
    for r in keyed + [r for r in rows if r[TRACE_ID] == trace_id]:
        d = out.setdefault(r[TURN], {})
        d.update({a: r[a] for a in arrays if r[a] is not None})
        if r.get(TOKEN_STATS_SOURCE):
            d[TOKEN_STATS_SOURCE] = r[TOKEN_STATS_SOURCE]
    return out


def _visible(text: str) -> str:
    return text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "\u00b7")


#: Key of the tokenizer in the run config written into every file's metadata.
CONFIG_TOKENIZER = "tokenizer"


def run_tokenizer_path(path: str) -> str | None:
    """The tokenizer path the run was recorded with (its config), if it was a path that still exists."""
    try:
        files = tracer.list_trace_files(path)
    except FileNotFoundError:
        return None
    for file in files[:1]:
        try:
            config = json.loads(tracer.read_file_metadata(file).get(META_CONFIG, "{}"))
        except (OSError, ValueError, pa.ArrowException):
            return None
        tok = config.get(CONFIG_TOKENIZER) if isinstance(config, dict) else None
        if isinstance(tok, str) and os.path.exists(tok):
            return tok
    return None


def load_token_decoder(tokenizer_path: str) -> Callable[[list[int]], list[str]]:
    """A function turning token ids into one text piece per token, from a ``tokenizer.json`` (or its folder).

    Needs the ``tokenizers`` package, imported here only.

    Raises:
        FileNotFoundError: no tokenizer.json at ``tokenizer_path``.
        ImportError: ``tokenizers`` is not installed; names the pip line.
    """
    file = tokenizer_path if os.path.isfile(tokenizer_path) else os.path.join(tokenizer_path, "tokenizer.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no tokenizer.json at {tokenizer_path!r}; give a tokenizer.json file or its folder")
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ImportError(f"showing token text needs the tokenizers package: {install_command('tokenizers')}") from exc
    tok = Tokenizer.from_file(file)
    table = piece_table(tok)

    def decode(ids: list[int]) -> list[str]:
        # The recorder's own rendering (tracer.record.pieces): the same text a run recorded with token2text shows.
        return table.pieces(ids, tok)

    return decode


def token_turns(
    spans: pa.Table,
    decoder: Callable[[list[int]], list[str]] | None = None,
    stats: dict[int, dict[str, Any]] | None = None,
) -> list[TokenTurn]:
    """The llm calls' response tokens, logprobs and truncation, in call order.

    Read from :func:`tracer.summary.span_turns`, so every recognised output
    shape (this project's ``logprobs``, verl's ``log_probs``, OpenAI and vLLM
    shapes) shows. Each token's text is the one recorded with token2text
    (``*_token_texts``) when the span has it; else ``decoder`` (see
    :func:`load_token_decoder`) gives each token id its text, so the token
    view shows where each token starts and ends.
    """
    out = []
    llm = [t for t in span_turns(spans) if t.role == "assistant"]
    for i, t in enumerate(llm):
        ids = list(t.token_ids) if t.token_ids is not None else None
        texts = list(t.token_texts) if t.token_texts is not None else None
        if texts is None and ids is not None and decoder is not None:
            try:
                texts = decoder([int(x) for x in ids])
            except Exception:  # a tokenizer that does not fit these ids must not break the view
                texts = None
        out.append(
            TokenTurn(
                name=t.name or "",
                index=i,
                token_ids=ids,
                token_texts=texts,
                logprobs=_rollout_logprobs(t.logprobs, (stats or {}).get(i, {})),
                text=t.response_text,
                recorded=t.token_count,
                truncated=t.truncated,
                finish_reason=t.finish_reason,
                prompt_tokens=t.prompt_token_count,
                stats={k: v for k, v in (stats or {}).get(i, {}).items() if k != TOKEN_STATS_SOURCE},
                stats_source=(stats or {}).get(i, {}).get(TOKEN_STATS_SOURCE),
            )
        )
    return out


def has_token_stats(path: str) -> bool:
    """Whether the run logged any per-token stats (the shard indexes' span names, else the name column)."""
    return tracer.read.has_spans_named(path, TOKEN_STATS_SPAN_NAME)


def load_token_stats(
    path: str,
    steps: Iterable[int] | None = None,
    trace_ids: Sequence[str] | None = None,
    rollout_logprobs: bool = True,
) -> Loaded:
    """:func:`tracer.read_token_stats` with the readers' warnings (an empty table when none were logged).

    The token view passes ``rollout_logprobs=False``: it has the turn's own logprobs.
    """
    return _reading(
        tracer.read_token_stats,
        path,
        trace_ids=None if trace_ids is None else list(trace_ids),
        steps=None if steps is None else list(steps),
        rollout_logprobs=rollout_logprobs,
    )


def synthetic_sources(token_stats: pa.Table) -> list[str]:
    """The distinct ``source`` values of token stats that say they are synthetic (made up, not a trainer's)."""
    if TOKEN_STATS_SOURCE not in token_stats.column_names:
        return []
    sources = {s for s in token_stats.column(TOKEN_STATS_SOURCE).to_pylist() if s}
    return sorted(s for s in sources if "synthetic" in s.lower())
