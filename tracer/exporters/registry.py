"""Registry of backend names.

``arrow`` is the local file writer every other backend is fed from. Live
exporters register here as ``name -> "module:Class"`` so that naming a backend
never imports its heavy dependency until it is used.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Backend name -> "module:attribute" of its exporter class (None: built in).
BACKENDS: dict[str, str | None] = {
    "arrow": None,
    "mlflow": "tracer.exporters.mlflow:MlflowExporter",
    "wandb": "tracer.exporters.wandb:WandbExporter",
    "swanlab": "tracer.exporters.swanlab:SwanlabExporter",
    "console": "tracer.exporters.console:ConsoleExporter",
}


def available_backends() -> tuple[str, ...]:
    """Names a config's ``backend`` may take."""
    return tuple(BACKENDS)


def load_backend(name: str) -> Any:
    """Import and return the exporter class registered for ``name``."""
    target = BACKENDS[name]
    if target is None:
        raise KeyError(f"backend {name!r} has no exporter class")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
