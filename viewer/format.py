"""How numbers are written in tiles and captions: short enough that a tile never cuts them off."""

from __future__ import annotations

from typing import Any


def metric_value(v: Any) -> str:
    """A tile's value: integers with thousands separators, other numbers with 4 significant digits."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def seconds(s: float | None) -> str:
    """A duration: ms below one second, else seconds with 3 significant digits, minutes above 100 s."""
    if s is None:
        return "—"
    if s < 1:
        return f"{s * 1000:.3g} ms"
    if s < 100:
        return f"{s:.3g} s"
    return f"{s / 60:.3g} min"


def short(x: Any) -> str:
    """A reward or advantage in a caption: 3 significant digits."""
    return "—" if x is None else f"{x:.3g}"


def short_ids(ids: list[str], least: int = 6) -> list[str]:
    """Each id cut to the shortest start or end (at least ``least`` characters) that tells them all apart.

    An ellipsis marks the cut side; ids that differ nowhere shorter are whole.
    """
    distinct = set(ids)
    longest = max((len(i) for i in distinct), default=0)
    for n in range(least, longest):
        if len({i[:n] for i in distinct}) == len(distinct):
            return [i if len(i) <= n else i[:n] + "…" for i in ids]
        if len({i[-n:] for i in distinct}) == len(distinct):
            return [i if len(i) <= n else "…" + i[-n:] for i in ids]
    return list(ids)


def one_line(text: str | None, limit: int) -> str:
    """``text`` on one line (runs of whitespace as one space), cut to ``limit`` characters with an ellipsis."""
    if text is None:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
