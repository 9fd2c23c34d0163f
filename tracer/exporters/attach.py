"""Live exporters: a :class:`~tracer.exporters.base.LiveDriver` per backend a config names, fed each durable batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tracer.backends import BACKENDS, LOCAL_BACKEND, ExportOptionError, get_backend, load_sink, resolve_options
from tracer.config import TraceConfig, TraceConfigError
from tracer.exporters.base import LiveDriver, live_target

if TYPE_CHECKING:
    from tracer.record.recorder import Recorder


def attach_exporters(rec: Recorder) -> None:
    """Add a live driver per backend of ``rec.config`` to the recorder (ImportError with the pip line)."""
    for name in rec.config.backends:
        if name == LOCAL_BACKEND or name not in BACKENDS:
            continue
        rec.add_driver(attach_backend(name, rec.config))


def live_options(name: str, config: TraceConfig) -> dict[str, Any]:
    """Backend ``name``'s options from ``config.backend_options``: nested (``{"mlflow": {"tracking_uri": ...}}``,
    which wins) or flat with the backend's name as prefix (``{"wandb_mode": "offline"}``, verl's ``wandb_proxy``);
    TraceConfigError for a value of the wrong type or choice."""
    entry = get_backend(name)
    given = config.backend_options or {}
    nested = given[name] if isinstance(given.get(name), Mapping) else {}
    found: dict[str, Any] = {}
    for option in (o for o in entry.options if o.live):
        flat = option.live_key or f"{name}_{option.name}"
        if option.name in nested or flat in given:
            found[option.name] = nested[option.name] if option.name in nested else given[flat]
    try:
        return resolve_options(name, found, live=True)
    except ExportOptionError as exc:
        raise TraceConfigError(f"backend_options: {exc}") from None


def attach_backend(name: str, config: TraceConfig) -> LiveDriver:
    """A live driver feeding backend ``name``'s sink, for a recorder of ``config`` (ImportError with the pip line)."""
    sink = load_sink(name)(live_options(name, config))
    return LiveDriver(sink, name, live_target(config), config.run_dir, grace_s=2 * config.flush_interval_s)
