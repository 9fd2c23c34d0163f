"""verl drop-in: verl's ``rollout_trace`` API, recorded by rollout-trace.

The same three names and signatures as ``verl.utils.rollout_trace``
(``RolloutTraceConfig``, ``rollout_trace_attr``, ``rollout_trace_op``);
:func:`install` makes verl import these, in every Ray worker by configuration alone::

    python -m verl.trainer.main_ppo ... \\
        actor_rollout_ref.rollout.trace.backend=arrow \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tracer.integrations.verl.install \\
        +ray_kwargs.ray_init.runtime_env.env_vars.ROLLOUT_TRACE_DIR=/shared/traces

verl's own ``weave`` backend goes to verl's original module; a name neither knows
records nothing, with a warning. Importing this module does not import verl.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import os
import sys
import types
from collections.abc import Callable
from typing import Any, ClassVar

import tracer
from tracer.config import as_bool
from tracer.record.context import CURRENT_SPAN
from tracer.record.spec import LAYOUT_ATTR, LAYOUT_VERL

__all__ = [
    "KIND_BY_METHOD",
    "ORIGINAL_ALIAS",
    "PROVIDED",
    "VERL_MODULE",
    "RolloutTraceConfig",
    "find_verl_config",
    "install",
    "installed",
    "rollout_trace_attr",
    "rollout_trace_op",
    "span_kind",
    "uninstall",
]

logger = logging.getLogger("rollout_trace")

#: The verl module this one stands in for.
VERL_MODULE = "verl.utils.rollout_trace"
#: Name verl's original module is loaded under for a backend only it has (``weave``, ``trackio``).
ORIGINAL_ALIAS = "verl.utils._rollout_trace_original"
#: Names :func:`install` provides in ``verl.utils.rollout_trace``.
PROVIDED = ("RolloutTraceConfig", "rollout_trace_attr", "rollout_trace_op")

#: Span kinds by the last part of a method's ``__qualname__`` (verl's decorator has no kind argument).
KIND_BY_METHOD = {
    "generate": "llm",
    "chat_completion": "llm",
    "execute": "tool",
}

# verl's original module when RolloutTraceConfig.init chose a backend only it has: every call goes there.
_delegate: types.ModuleType | None = None


def span_kind(qualname: str) -> str | None:
    """The span kind of a verl method from its ``__qualname__``: ``*AgentLoop.run`` a root, then :data:`KIND_BY_METHOD`."""
    parts = qualname.split(".")
    method = parts[-1]
    owner = parts[-2] if len(parts) > 1 else ""
    if method == "run" and "AgentLoop" in owner:
        return "rollout"
    return KIND_BY_METHOD.get(method)


class RolloutTraceConfig:
    """verl's per-process trace settings singleton (same attributes and class methods), backed by :func:`tracer.init`.

    ``init`` counts once per process, as in verl, until :meth:`reset`. ``client`` is the ``tracer``
    module (verl's client for its own backends; None when off); ``max_samples_per_step_per_worker``
    is applied by verl's worker itself, not twice.
    """

    _instance: ClassVar[RolloutTraceConfig | None] = None
    backend: str | None = None
    client: object | None = None
    token2text: bool = False
    _initialized: bool = False
    project_name: str | None = None
    experiment_name: str | None = None
    max_samples_per_step_per_worker: int | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> RolloutTraceConfig:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
            cls._instance._initialized = False
        return cls._instance

    @classmethod
    def get_instance(cls) -> RolloutTraceConfig:
        """The process's instance (created empty on first use)."""
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    @classmethod
    def init(
        cls,
        project_name: str | None,
        experiment_name: str | None,
        backend: str | None,
        token2text: bool = False,
        max_samples_per_step_per_worker: int | None = None,
    ) -> None:
        """Start tracing in this process with verl's trace settings.

        Other fields come from the environment or a config given to :func:`tracer.init`; verl's whole
        config (:func:`find_verl_config`) is the ``run_config`` unless one was given. A backend neither
        knows records nothing, as in verl, with one warning per name.
        """
        global _delegate
        config = cls.get_instance()
        if config._initialized:
            return
        name = None if backend is None or str(backend).strip().lower() in ("", "none", "null") else str(backend)
        config.backend = name
        config.token2text = as_bool("token2text", token2text) if isinstance(token2text, str) else bool(token2text)
        config.project_name = project_name
        config.experiment_name = experiment_name
        config.max_samples_per_step_per_worker = max_samples_per_step_per_worker
        config.client = None
        unknown = _unknown_backend(name)
        if unknown is not None:
            _warn_unknown_backend(unknown)  # as verl: an unknown name records nothing and training goes on
        elif name is not None and name.lower() in _verl_only_backends():
            original = _original_module()
            original.RolloutTraceConfig.init(
                project_name, experiment_name, name, token2text, max_samples_per_step_per_worker
            )
            config.client = original.RolloutTraceConfig.get_client()
            _delegate = original
        elif name is not None:
            fields: dict[str, Any] = {"backend": name, "token2text": config.token2text}
            if project_name:
                fields["project_name"] = str(project_name)
            if experiment_name:
                fields["experiment_name"] = str(experiment_name)
            given = tracer.get_config()
            if given is None or not given.run_config:  # a run_config given to tracer.init wins
                run_config = find_verl_config(sys._getframe(1))
                if run_config:
                    fields["run_config"] = run_config
            tracer.init(given, **fields)
            config.client = tracer
        config._initialized = True

    @classmethod
    def get_backend(cls) -> str | None:
        """The backend name, or None when tracing is off."""
        return cls.get_instance().backend

    @classmethod
    def get_client(cls) -> object | None:
        """The backend's client object (the ``tracer`` module for ours)."""
        return cls.get_instance().client

    @classmethod
    def enable_token2text(cls) -> bool | None:
        """Whether token ids are decoded to text."""
        return cls.get_instance().token2text

    @classmethod
    def reset(cls) -> None:
        """Forget the settings and close rollout-trace's files (tests call it)."""
        global _delegate
        inst = cls._instance
        cls._instance = None
        if _delegate is not None:
            _delegate.RolloutTraceConfig.reset()
            _delegate = None
        elif inst is not None and inst.client is tracer:
            tracer.shutdown()


def find_verl_config(frame: types.FrameType | None, depth: int = 4) -> dict[str, Any] | None:
    """verl's whole config as a plain dict, found in the caller of ``RolloutTraceConfig.init``; None if not there.

    verl's ``AgentLoopWorker.__init__`` holds it as ``config`` or ``self.config`` (a ``DictConfig`` with
    ``actor_rollout_ref``): the first in ``frame`` or ``depth - 1`` frames above it, interpolations
    resolved where they can be.
    """
    for _ in range(depth):
        if frame is None:
            return None
        local = frame.f_locals
        for candidate in (local.get("config"), getattr(local.get("self"), "config", None)):
            plain = _plain_verl_config(candidate)
            if plain is not None:
                return plain
        frame = frame.f_back
    return None


def _plain_verl_config(value: object) -> dict[str, Any] | None:
    """``value`` as a plain dict when it is a verl trainer config (an OmegaConf mapping with ``actor_rollout_ref``)."""
    omegaconf: Any = sys.modules.get("omegaconf")  # a DictConfig means verl imported it already
    if omegaconf is None or not isinstance(value, omegaconf.DictConfig):
        return None
    try:
        if "actor_rollout_ref" not in value:
            return None
        try:
            plain = omegaconf.OmegaConf.to_container(value, resolve=True, throw_on_missing=False, enum_to_str=True)
        except Exception:  # an interpolation that cannot be resolved here: keep it as written
            plain = omegaconf.OmegaConf.to_container(value, resolve=False, enum_to_str=True)
    except Exception:  # the tracer's trouble never reaches verl
        logger.debug("rollout-trace: verl's config could not be read as run_config", exc_info=True)
        return None
    return plain if isinstance(plain, dict) else None


def rollout_trace_attr(
    sample_index: Any = None,
    step: int | None = None,
    rollout_n: int | None = None,
    name: str = "rollout_trace",
    validate: bool = False,
    trace: bool = True,
) -> contextlib.AbstractContextManager[Any]:
    """verl's ``rollout_trace_attr``: :class:`tracer.rollout_trace_attr` (verl's own for a verl-only backend)."""
    if _delegate is not None:
        return _delegate.rollout_trace_attr(sample_index, step, rollout_n, name, validate, trace)
    # rollout_n=None is kept as null, as verl does.
    return tracer.rollout_trace_attr(
        sample_index,
        step,
        rollout_n,  # type: ignore[arg-type]
        name=name,
        validate=validate,
        trace=trace,
    )


def rollout_trace_op(func: Callable[..., Any]) -> Callable[..., Any]:
    """verl's ``rollout_trace_op``: each call a span named ``func.__qualname__``, kind :func:`span_kind`."""
    # Inputs bound as verl binds them, token2text's texts where verl puts them.
    with contextlib.suppress(AttributeError, TypeError):
        setattr(func, LAYOUT_ATTR, LAYOUT_VERL)
    kind = span_kind(func.__qualname__)
    ours = tracer.rollout_trace_op(name=func.__qualname__, kind=kind)(func)
    if kind == "rollout":
        # Inside verl's rollout_trace_attr block the block ("agent_loop") is the root and run its child, as in
        # verl's MLflow traces; outside any block run starts a trajectory of its own.
        in_block = tracer.rollout_trace_op(name=func.__qualname__)(func)
        rooted = ours

        def ours(*args: Any, **kwargs: Any) -> Any:
            frame = CURRENT_SPAN.get()
            return (in_block if frame is not None and frame[2] is not None else rooted)(*args, **kwargs)

    theirs: dict[int, Callable[..., Any]] = {}

    def original(delegate: types.ModuleType) -> Callable[..., Any]:
        fn = theirs.get(id(delegate))
        if fn is None:
            fn = theirs[id(delegate)] = delegate.rollout_trace_op(func)
        return fn

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            delegate = _delegate
            if delegate is not None:
                return await original(delegate)(*args, **kwargs)
            return await ours(*args, **kwargs)

        traced_async.__rollout_trace_verl__ = True  # type: ignore[attr-defined]
        return traced_async

    @functools.wraps(func)
    def traced(*args: Any, **kwargs: Any) -> Any:
        delegate = _delegate
        if delegate is not None:
            return original(delegate)(*args, **kwargs)
        return ours(*args, **kwargs)

    traced.__rollout_trace_verl__ = True  # type: ignore[attr-defined]
    return traced


_WARNED_BACKENDS: set[str] = set()


def _unknown_backend(name: str | None) -> str | None:
    """The part of ``name`` (comma-separated backends) that neither rollout-trace nor verl knows, or None."""
    if name is None:
        return None
    valid = {*tracer.available_backends(), *_verl_only_backends()}
    return next((p for p in (part.strip().lower() for part in name.split(",")) if p and p not in valid), None)


def _warn_unknown_backend(name: str) -> None:
    if name in _WARNED_BACKENDS:
        return
    _WARNED_BACKENDS.add(name)
    valid = [*tracer.available_backends(), *_verl_only_backends()]
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    logger.warning(
        "rollout-trace: verl's rollout trace backend %r is unknown, so nothing is recorded (as in verl); %svalid: %s",
        name,
        hint,
        ", ".join(valid),
    )


def _verl_only_backends() -> tuple[str, ...]:
    """verl backends rollout-trace does not implement itself."""
    return tuple(b for b in ("weave", "trackio") if b not in tracer.available_backends())


def _original_module() -> types.ModuleType:
    """verl's own ``rollout_trace`` module, loaded under :data:`ORIGINAL_ALIAS`."""
    loaded = sys.modules.get(ORIGINAL_ALIAS)
    if loaded is not None:
        return loaded
    current = sys.modules.get(VERL_MODULE)
    if current is not None and getattr(current, "__rollout_trace_stand_in__", False) is False:
        return current  # install() found it imported already: it is the original
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise tracer.TraceConfigError(
            "backend: verl's own backends (weave, trackio) need verl installed; "
            "pip install verl, or use one of " + ", ".join(tracer.available_backends())
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], "utils", "rollout_trace.py")
    file_spec = importlib.util.spec_from_file_location(ORIGINAL_ALIAS, path)
    assert file_spec is not None and file_spec.loader is not None
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[ORIGINAL_ALIAS] = module
    file_spec.loader.exec_module(module)
    return module


def _stand_in_module() -> types.ModuleType:
    """A fresh module named ``verl.utils.rollout_trace`` holding this module's names."""
    module = types.ModuleType(VERL_MODULE, __doc__)
    for name in PROVIDED:
        setattr(module, name, globals()[name])
    module.__rollout_trace_stand_in__ = True  # type: ignore[attr-defined]
    module.__all__ = list(PROVIDED)  # type: ignore[attr-defined]
    return module


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _stand_in_module()

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _StandInFinder(importlib.abc.MetaPathFinder):
    """Answers ``import verl.utils.rollout_trace`` with the stand-in module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != VERL_MODULE:
            return None
        return importlib.util.spec_from_loader(fullname, _StandInLoader())


def installed() -> bool:
    """True when :func:`install` is in force in this process."""
    return any(isinstance(f, _StandInFinder) for f in sys.meta_path)


def install() -> None:
    """Make verl's ``rollout_trace`` names record with rollout-trace in this process (again: nothing).

    Call it before verl's agent loops are imported (Ray: ``worker_process_setup_hook``); after, the
    names are replaced in place and a warning says methods decorated before keep verl's tracing.
    """
    if installed():
        return
    sys.meta_path.insert(0, _StandInFinder())
    current = sys.modules.get(VERL_MODULE)
    if current is None or getattr(current, "__rollout_trace_stand_in__", False):
        return
    # Imported before install(): swap its names; modules that already did `from ... import` keep theirs.
    for name in PROVIDED:
        setattr(current, name, globals()[name])
    current.__rollout_trace_stand_in__ = True  # type: ignore[attr-defined]
    logger.warning(
        "rollout-trace: %s was imported before tracer.integrations.verl.install(); methods decorated "
        "before now keep verl's tracing. Install it earlier (Ray runtime_env worker_process_setup_hook).",
        VERL_MODULE,
    )


def uninstall() -> None:
    """Undo :func:`install` for later imports (tests use it)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _StandInFinder)]
    current = sys.modules.get(VERL_MODULE)
    if current is not None and getattr(current, "__rollout_trace_stand_in__", False):
        del sys.modules[VERL_MODULE]
