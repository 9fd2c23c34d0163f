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
