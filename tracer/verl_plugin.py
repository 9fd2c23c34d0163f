"""verl plugin: say so when a worker's verl config names a rollout-trace backend but the drop-in is not installed.

verl 0.9.1 loads every ``verl.plugins`` entry point when it is imported
(unless ``VERL_USE_EXTERNAL_PLUGINS=none``); rollout-trace registers this
module there (``pyproject.toml``), so it is imported in every process that
imports verl: the driver and each Ray worker. It records nothing and changes
nothing verl does. It only watches verl's own ``verl.utils.rollout_trace``
(the module :func:`tracer.verl_compat.install` replaces): when that module's
``RolloutTraceConfig.init`` is called, which verl's ``AgentLoopWorker`` does
with ``actor_rollout_ref.rollout.trace.backend``, and the backend is one
only rollout-trace has (``arrow``, ``wandb``, ...), verl would record nothing
without a word; this logs one warning per process with the line that fixes
it. ``mlflow`` is a backend of both: verl's own MLflow tracing then records,
so the warning is given only when a ``ROLLOUT_TRACE_*`` variable in the
worker's environment says rollout-trace was meant.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

import tracer
from tracer import verl_compat
from tracer.config import ENV_BACKEND, ENV_CONFIG, ENV_TRACE_DIR

logger = logging.getLogger("rollout_trace")

#: Backends verl's own ``rollout_trace`` implements.
VERL_BACKENDS = ("weave", "mlflow", "trackio")
#: The verl command-line override that installs the drop-in in every Ray worker.
FIX_OVERRIDE = "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tracer.verl_compat.install"
#: Environment variables whose presence says a worker was meant to record with rollout-trace.
INTENT_VARIABLES = (ENV_TRACE_DIR, ENV_BACKEND, ENV_CONFIG)
#: Attribute marking verl's ``RolloutTraceConfig.init`` once it is watched.
_MARK = "__rollout_trace_watched__"

_warned = False


def misconfiguration(backend: object) -> str | None:
    """The warning for verl tracing configured with ``backend`` in a process without the drop-in, or None.

    None when the drop-in is installed, when tracing is off, for verl's own
    ``weave``/``trackio``, and for ``mlflow`` unless a ``ROLLOUT_TRACE_*``
    variable is set.
    """
    if verl_compat.installed() or backend is None:
        return None
    name = str(backend).strip().lower()
    if name not in tracer.available_backends():
        return None
    if name in VERL_BACKENDS and not any(os.environ.get(v) for v in INTENT_VARIABLES):
        return None
    what = (
        "verl's own MLflow tracing records instead of rollout-trace"
        if name in VERL_BACKENDS
        else "verl records nothing for it"
    )
    return (
        f"rollout-trace: verl's config names the rollout-trace backend {name!r} "
        f"(actor_rollout_ref.rollout.trace.backend) in process {os.getpid()}, but tracer.verl_compat is not "
        f"installed here, so {what}. Fix: add {FIX_OVERRIDE} to verl's command line (outside Ray: call "
        "tracer.verl_compat.install() before importing verl's agent loop)."
    )


def _warn(backend: object) -> None:
    global _warned
    if _warned:
        return
    message = misconfiguration(backend)
    if message is not None:
        _warned = True
        logger.warning(message)


def watch(module: types.ModuleType) -> None:
    """Wrap verl's ``RolloutTraceConfig.init`` in ``module`` so a misconfiguration is logged (once per process)."""
    config_class = getattr(module, "RolloutTraceConfig", None)
    init = getattr(config_class, "init", None)
    if config_class is None or init is None or getattr(init, _MARK, False):
        return
    original = init.__func__ if isinstance(init, types.MethodType) else init

    @functools.wraps(original)
    def watched(cls: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _warn(kwargs["backend"] if "backend" in kwargs else args[2] if len(args) > 2 else None)
        except Exception:  # the tracer's trouble never reaches verl
            pass
        return original(cls, *args, **kwargs)

    setattr(watched, _MARK, True)
    config_class.init = classmethod(watched)


class _WatchingLoader(importlib.abc.Loader):
    """verl's own loader for its ``rollout_trace`` module, then :func:`watch` on the result."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        watch(module)


class _Watcher(importlib.abc.MetaPathFinder):
    """Finds verl's own ``rollout_trace`` as Python would, with :class:`_WatchingLoader` around its loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != verl_compat.VERL_MODULE or verl_compat.installed():
            return None  # the drop-in's own finder (first on sys.meta_path) answers
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _WatchingLoader(spec.loader)
        return spec


def register() -> None:
    """Watch verl's ``rollout_trace`` in this process: now if it is imported, else when it is. Idempotent."""
    current = sys.modules.get(verl_compat.VERL_MODULE)
    if current is not None:
        if not getattr(current, "__rollout_trace_stand_in__", False):
            watch(current)
        return
    if not any(isinstance(f, _Watcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _Watcher())  # before the PathFinder that would find verl's module


# verl's plugin loader only imports this module (EntryPoint.load): the import is the registration.
register()
