"""Registry of backends (:data:`BACKENDS`): each one's name, sink class (imported when used), extra and options,
declared once for the CLI, the Python API and the live options. ``arrow``, the local writer, feeds the others."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

from tracer.extras import require_backend

#: Name of the local Arrow file writer, the backend every other one is fed from.
LOCAL_BACKEND = "arrow"

#: ``Option.live_default`` when live export uses the same default as post-hoc export.
_SAME: Any = object()


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of a backend: a keyword of :func:`export_files`, ``--name-with-dashes`` on the CLI."""

    name: str
    type: type  # str, int, float or bool
    default: Any = None  # post hoc, when not given
    help: str = ""  # one line for --help
    choices: tuple[Any, ...] | None = None  # None: any value of the type
    live_default: Any = _SAME  # live, when not configured (default: default)
    flag: str | None = None  # the CLI flag when not --name-with-dashes
    live: bool = True  # read from TraceConfig.backend_options live
    live_key: str | None = None  # its flat backend_options key (default <backend>_<name>)

    @property
    def cli_flag(self) -> str:
        """The option's CLI flag."""
        return self.flag or "--" + self.name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class Backend:
    """One backend's entry: its ``--to``/``backend=`` name and ``"module:Class"`` sink."""

    name: str
    sink: str
    requires: str | None = None  # the library it imports (checked at tracer.init)
    extra: str | None = None  # the extra of pyproject.toml that installs it
    options: tuple[Option, ...] = ()
    help: str = ""  # what it does, one line

    def option(self, name: str) -> Option | None:
        """The option called ``name``, if this backend has one."""
        return next((o for o in self.options if o.name == name), None)


class ExportOptionError(ValueError):
    """An unknown backend or option, or an option value of the wrong type or not among its choices."""


_PROJECT = Option("project", str, None, "project on the backend (default: the recorded project name)")
_EXPERIMENT = Option("experiment", str, None, "run name on the backend (default: the recorded experiment name)")
_TIMEOUT = Option("timeout_s", float, 120.0, "seconds one call to the backend (a step's write) may take")


def _exporter(name: str, sink: str, help: str, *options: Option, requires: str | None = None) -> Backend:
    """A backend with sink ``tracer.exporters.<name>:<sink>`` whose library (unless ``requires``) and extra are ``name``."""
    return Backend(name, f"tracer.exporters.{name}:{sink}", requires or name, name, options, help)


_MLFLOW = _exporter(
    "mlflow",
    "MlflowSink",
    "one MLflow trace per trajectory, linked to a run with per-step metrics",
    Option("tracking_uri", str, None, "MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db)"),
    Option(
        "experiment",
        str,
        None,
        "MLflow experiment (default: the recorded project name; the run is the experiment name)",
    ),
    Option(
        "method",
        str,
        "auto",
        "auto (fast path on checked mlflow versions), fast, or public (MLflow's span API)",
        choices=("auto", "fast", "public"),
    ),
    _TIMEOUT,
)
_WANDB = _exporter(
    "wandb",
    "WandbSink",
    "per-step trajectory tables and rollout metrics in a wandb run",
    _PROJECT,
    _EXPERIMENT,
    Option("mode", str, "offline", "wandb mode", choices=("offline", "online"), live_default=None),
    Option(
        "run_dir",
        str,
        None,
        "parent directory of the run's files (default WANDB_DIR or .)",
        flag="--dir",
        live_key="wandb_dir",
    ),
    Option("proxy", str, None, "HTTP(S) proxy for wandb's traffic (verl's wandb_proxy)"),
    Option("max_rows", int, None, "rows per table increment (at most wandb.Table.MAX_ROWS)"),
    _TIMEOUT,
)
_SWANLAB = _exporter(
    "swanlab",
    "SwanlabSink",
    "per-step trajectory tables, conversations and rollout metrics in a SwanLab run",
    _PROJECT,
    _EXPERIMENT,
    Option("mode", str, "local", "swanlab mode", choices=("local", "offline", "online"), live_default=None),
    Option("log_dir", str, None, "directory of the run's files (default ./swanlog)"),
    _TIMEOUT,
)
_TRACKIO = _exporter(
    "trackio",
    "TrackioSink",
    "per-step trajectory tables and rollout metrics in a local-first trackio run (TRACKIO_DIR)",
    _PROJECT,
    _EXPERIMENT,
)
_OTLP = _exporter(
    "otlp",
    "OtlpSink",
    "one OpenTelemetry trace per trajectory (GenAI conventions) posted to an OTLP/HTTP endpoint",
    Option("endpoint", str, None, "OTLP/HTTP URL (default OTEL_EXPORTER_OTLP_ENDPOINT, else 127.0.0.1:4318)"),
    Option("headers", str, None, "request headers NAME=VALUE,... (e.g. x-mlflow-experiment-id=1)"),
    Option("timeout_s", float, 30.0, "seconds per request"),
    Option(
        "content",
        bool,
        False,
        "send content: gen_ai.input/output.messages, tool arguments and results, span inputs and outputs",
    ),
    requires="opentelemetry.proto",
)
_CONSOLE = Backend(
    "console",
    "tracer.exporters.console:ConsoleSink",
    help="one summary line per step on the log and stderr",
    options=(Option("print", bool, True, "print the lines to stderr too (not only to the log)"),),
)
#: Backend name -> its entry, in the order help texts list them.
BACKENDS: dict[str, Backend] = {b.name: b for b in (_MLFLOW, _WANDB, _SWANLAB, _TRACKIO, _OTLP, _CONSOLE)}


def available_backends() -> tuple[str, ...]:
    """Names a config's ``backend`` may take."""
    return (LOCAL_BACKEND, *BACKENDS)


def did_you_mean(unknown: Iterable[str], valid: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean 'x'?)`` for the closest valid names, or an empty string."""
    choices = sorted(valid)
    guesses = [f"{prefix}{m}" for u in unknown for m in difflib.get_close_matches(u, choices, n=1)]
    return f" (did you mean {', '.join(repr(g) for g in dict.fromkeys(guesses))}?)" if guesses else ""


def get_backend(name: str) -> Backend:
    """The entry of backend ``name``; ExportOptionError naming the valid ones and the closest if none."""
    entry = BACKENDS.get(name)
    if entry is None:
        raise ExportOptionError(
            f"unknown backend {name!r}{did_you_mean([name], BACKENDS)}; valid choices are {', '.join(BACKENDS)}"
        )
    return entry


def load_sink(name: str) -> Any:
    """The sink class of backend ``name``, imported (ImportError with the pip line when its library is missing)."""
    entry = get_backend(name)
    if entry.requires and entry.extra:
        require_backend(entry.requires, entry.extra)
    module, _, attr = entry.sink.partition(":")
    return getattr(importlib.import_module(module), attr)


_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _coerce(backend: str, option: Option, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str) and option.type is not str:
        try:
            value = _BOOL_WORDS[value.strip().lower()] if option.type is bool else option.type(value)
        except (KeyError, ValueError):
            what = "boolean; give true or false" if option.type is bool else option.type.__name__
            raise ExportOptionError(f"{backend} option {option.name}={value!r} is not a {what}") from None
    elif option.type is str and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if option.choices is not None and value not in option.choices:
        raise ExportOptionError(
            f"{backend} option {option.name}={value!r} is not valid; valid values are "
            f"{', '.join(map(str, option.choices))}"
        )
    return value


def resolve_options(name: str, options: Mapping[str, Any], live: bool = False) -> dict[str, Any]:
    """Every option of backend ``name``: the given ones checked, the rest at their defaults; ExportOptionError
    for an unknown option (naming the closest) or a value of the wrong type or choice."""
    entry = get_backend(name)
    known = [o.name for o in entry.options]
    for key in options:
        if key not in known:
            valid = ", ".join(known) or "none"
            raise ExportOptionError(
                f"unknown {name} option {key!r}{did_you_mean([key], known)}; {name} options are: {valid}"
            )
    out = {}
    for o in entry.options:
        default = o.live_default if live and o.live_default is not _SAME else o.default
        out[o.name] = _coerce(name, o, options.get(o.name, default))
    return out
