"""verl plugin: warn when the drop-in is missing; in the Ray driver, ship what ended workers had not.

Imported by verl in the driver and every Ray worker; records nothing. verl's ``RolloutTraceConfig.init`` with a
backend only rollout-trace has logs, once per process, the line that installs the drop-in (for ``mlflow`` only
when a ``ROLLOUT_TRACE_*`` variable is set). In a Ray driver whose job installs the drop-in or names
``ROLLOUT_TRACE_DIR``, ``ray.shutdown`` (and the exit) ships what the ended workers' live backends lack
(:func:`tracer.exporters.catch_up.catch_up`) within ``ROLLOUT_TRACE_DRAIN_S`` seconds (``0``: off).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import time
import types
from collections.abc import Sequence
from typing import Any

import tracer
from tracer.config import DEFAULT_DRAIN_S, ENV_BACKEND, ENV_CONFIG, ENV_DRAIN_S, ENV_TRACE_DIR
from tracer.exporters.catch_up import catch_up
from tracer.integrations import verl as drop_in

logger = logging.getLogger("rollout_trace")

#: Backends verl's own ``rollout_trace`` implements.
VERL_BACKENDS = ("weave", "mlflow", "trackio")
#: The hook value that installs the drop-in in Ray workers.
HOOK = "tracer.integrations.verl.install"
#: Every hook value that does: also the drop-in's first path, in Ray configs already written.
HOOKS = (HOOK, "tracer.verl_compat.install")
#: The verl command-line override that installs the drop-in in every Ray worker.
FIX_OVERRIDE = f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={HOOK}"
#: Environment variables whose presence says a worker was meant to record with rollout-trace.
INTENT_VARIABLES = (ENV_TRACE_DIR, ENV_BACKEND, ENV_CONFIG)
#: Attribute marking verl's ``RolloutTraceConfig.init`` once it is watched.
_MARK = "__rollout_trace_watched__"

_warned = False
#: When this process imported the plugin: files older than this are not this job's.
_STARTED = time.time()
#: Prefixes of the runtime environment's variables the catch-up takes (where files land, where backends are).
TAKEN_VARIABLES = ("ROLLOUT_TRACE_", "MLFLOW_", "WANDB_", "SWANLAB_", "TRACKIO_", "OTEL_")


def misconfiguration(backend: object) -> str | None:
    """The warning for verl tracing configured with ``backend`` in a process without the drop-in, or None.

    None also for verl's own ``weave``/``trackio``, and for ``mlflow`` unless a ``ROLLOUT_TRACE_*`` variable is set.
    """
    if drop_in.installed() or backend is None:
        return None
    name = str(backend).strip().lower()
    if name not in tracer.available_backends():
        return None
    if name in VERL_BACKENDS and not any(os.environ.get(v) for v in INTENT_VARIABLES):
        return None
    what = (
        f"verl's own {name} tracing records instead of rollout-trace"
        if name in VERL_BACKENDS
        else "verl records nothing for it"
    )
    return (
        f"rollout-trace: verl's config names the rollout-trace backend {name!r} "
        f"(actor_rollout_ref.rollout.trace.backend) in process {os.getpid()}, but tracer.integrations.verl is not "
        f"installed here, so {what}. Fix: add {FIX_OVERRIDE} to verl's command line (outside Ray: call "
        "tracer.integrations.verl.install() before importing verl's agent loop)."
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
        if fullname != drop_in.VERL_MODULE or drop_in.installed():
            return None  # the drop-in's own finder (first on sys.meta_path) answers
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _WatchingLoader(spec.loader)
        return spec


def register() -> None:
    """Watch verl's ``rollout_trace`` in this process: now if it is imported, else when it is. Idempotent."""
    current = sys.modules.get(drop_in.VERL_MODULE)
    if current is not None:
        if not getattr(current, "__rollout_trace_stand_in__", False):
            watch(current)
        return
    if not any(isinstance(f, _Watcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _Watcher())  # before the PathFinder that would find verl's module


# -- the Ray driver -------------------------------------------------------------------


@dataclasses.dataclass
class DrainPlan:
    """What the driver's catch-up needs, read from Ray while it is still connected.

    ``root``: ``ROLLOUT_TRACE_DIR`` of the job, else of the driver; ``env``: the job's variables the backends read;
    ``timeout_s``: ``ROLLOUT_TRACE_DRAIN_S``.
    """

    root: str
    env: dict[str, str]
    timeout_s: float


def _ray_worker_module() -> Any:
    return sys.modules.get("ray._private.worker")


def _is_ray_driver() -> bool:
    """True in a process connected to Ray as a driver (not a worker)."""
    worker = _ray_worker_module()
    mode = getattr(getattr(worker, "global_worker", None), "mode", None)
    return mode is not None and mode == getattr(worker, "SCRIPT_MODE", 0)


def drain_plan(runtime_env: Any, environ: Any = os.environ) -> DrainPlan | None:
    """The catch-up a driver whose job has ``runtime_env`` owes its workers, or None.

    None unless the runtime environment (or the driver's) installs the drop-in or names ``ROLLOUT_TRACE_DIR``;
    None when ``ROLLOUT_TRACE_DRAIN_S`` is 0 or the folder is unknown.
    """
    env_vars = dict(runtime_env.get("env_vars") or {}) if hasattr(runtime_env, "get") else {}
    hook = runtime_env.get("worker_process_setup_hook") if hasattr(runtime_env, "get") else None
    root = env_vars.get(ENV_TRACE_DIR) or environ.get(ENV_TRACE_DIR)
    if not (hook in HOOKS or env_vars.get(ENV_TRACE_DIR)):
        return None
    raw = env_vars.get(ENV_DRAIN_S) or environ.get(ENV_DRAIN_S)
    try:
        timeout_s = float(raw) if raw else DEFAULT_DRAIN_S
    except ValueError:
        logger.warning("rollout-trace: %s=%r is not a number of seconds; using %s", ENV_DRAIN_S, raw, DEFAULT_DRAIN_S)
        timeout_s = DEFAULT_DRAIN_S
    if timeout_s <= 0:
        return None
    if not root:
        logger.info(
            "rollout-trace: the Ray job installs the drop-in but names no %s, so its driver does not know where "
            "the workers' files are to ship what they left (rollout-trace export RUN_DIR --to BACKEND does it later)",
            ENV_TRACE_DIR,
        )
        return None
    taken = {k: str(v) for k, v in env_vars.items() if k.startswith(TAKEN_VARIABLES)}
    return DrainPlan(os.path.abspath(str(root)), taken, timeout_s)


def _plan_now() -> DrainPlan | None:
    """The plan of this driver's job, read from Ray (None when not a connected driver; never raises)."""
    try:
        if not _is_ray_driver():
            return None
        ray = sys.modules["ray"]
        return drain_plan(ray.get_runtime_context().runtime_env)
    except Exception as exc:
        logger.debug("rollout-trace: no drain plan (%s: %s)", type(exc).__name__, exc)
        return None


def drain(plan: DrainPlan) -> None:
    """Ship, from the files, what the job's ended workers had not (the job's variables fill the driver's gaps)."""
    for key, value in plan.env.items():
        os.environ.setdefault(key, value)
    catch_up(plan.root, _STARTED, plan.timeout_s)


def watch_ray_driver() -> None:
    """In a Ray driver (or a process that may become one): catch up after ``ray.shutdown()`` and at exit. Idempotent.

    Does nothing in a Ray worker, or when Ray is not imported.
    """
    ray: Any = sys.modules.get("ray")
    worker = _ray_worker_module()
    if ray is None or worker is None:
        return
    mode = getattr(getattr(worker, "global_worker", None), "mode", None)
    if mode is not None and mode != getattr(worker, "SCRIPT_MODE", 0):
        return  # a worker: its driver does this
    original = getattr(ray, "shutdown", None)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def shutdown(*args: Any, **kwargs: Any) -> Any:
        plan = _plan_now()
        try:
            return original(*args, **kwargs)
        finally:
            if plan is not None:
                drain(plan)

    setattr(shutdown, _MARK, True)
    ray.shutdown = shutdown

    def at_exit() -> None:
        # Registered after Ray's own exit hook, so it runs first: end the job as that hook would, then catch up.
        if _is_ray_driver():
            shutdown()

    atexit.register(at_exit)


# verl's plugin loader only imports this module (EntryPoint.load): the import is the registration.
register()
watch_ray_driver()
