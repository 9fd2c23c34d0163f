"""Configuration: :class:`TraceConfig`, resolved from keyword arguments, then the environment, then defaults, or
parsed from verl-style dotted overrides (``actor_rollout_ref.rollout.trace.backend=arrow``) or the same keys in YAML."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from tracer.backends import LOCAL_BACKEND, available_backends, did_you_mean
from tracer.record.tokenizer import check_decodes, has_decode, load_tokenizer

#: Environment variable: default ``output_dir``.
ENV_TRACE_DIR = "ROLLOUT_TRACE_DIR"
#: Environment variable: default ``backend`` (``arrow``, ``none``, or a comma-separated list).
ENV_BACKEND = "ROLLOUT_TRACE_BACKEND"
#: Environment variable: ``1`` makes the tracer's own errors raise instead of being counted and logged (tests).
ENV_STRICT = "ROLLOUT_TRACE_STRICT"
#: Environment variable: a JSON object of config fields, under ``ROLLOUT_TRACE_DIR``/``ROLLOUT_TRACE_BACKEND`` and
#: keyword arguments (hands a whole config to Ray workers through ``runtime_env``).
ENV_CONFIG = "ROLLOUT_TRACE_CONFIG"
#: Environment variable: seconds a Ray driver's ``ray.shutdown()`` (or exit) may spend shipping what its workers'
#: live exporters had not (:mod:`tracer.integrations.verl_plugin`); ``0``: off.
ENV_DRAIN_S = "ROLLOUT_TRACE_DRAIN_S"
#: Default for :data:`ENV_DRAIN_S`, in seconds.
DEFAULT_DRAIN_S = 120.0

ON_FULL_CHOICES = ("block", "drop")
#: ``sample_strategy`` choices (see ``tracer.record.sampling``).
SAMPLE_STRATEGIES = ("uniform", "extremes", "variance")
#: ``sample_by`` choices: what ``extremes`` and ``variance`` rank groups by.
SAMPLE_BY_CHOICES = ("reward", "length")
_CHOICES = {"sample_strategy": SAMPLE_STRATEGIES, "sample_by": SAMPLE_BY_CHOICES, "on_buffer_full": ON_FULL_CHOICES}

#: Prefixes of verl-style dotted keys that address trace fields.
_TRACE_PREFIXES = ("actor_rollout_ref.rollout.trace.", "rollout.trace.", "trace.")
#: verl's trainer keys read as the fields of the same name.
_TRAINER_KEYS = {f"trainer.{name}": name for name in ("project_name", "experiment_name", "log_val_generations")}
#: Alternative names accepted for fields.
_ALIASES = {"max_samples": "max_samples_per_step_per_worker"}


class TraceConfigError(ValueError):
    """A configuration key or value is wrong; the message says how to fix it."""


@dataclasses.dataclass
class TraceConfig:
    """How and where this process records rollouts; docs/config.md gives each field's meaning, default and unit."""

    project_name: str = "rollout_trace"
    experiment_name: str = "default"
    backend: str | list[str] | None = LOCAL_BACKEND
    output_dir: str = "./rollout_traces"
    token2text: bool = False
    tokenizer: Any = None
    token_fields: tuple[str, ...] = ()
    max_tokens: int | None = None
    max_samples_per_step_per_worker: int | None = None
    store_full_token: bool = True
    seed: int = 0
    sample_strategy: str = "uniform"
    sample_by: str = "reward"
    sample_candidates_per_step: int | None = None
    flush_interval_s: float = 1.0
    max_file_bytes: int = 256 * 1024 * 1024
    max_buffered_spans: int = 20_000
    on_buffer_full: str = "block"
    compression_level: int = 3
    log_val_generations: int = 10
    backend_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    redact: bool = True
    redact_patterns: tuple[str, ...] = ()
    upload_interval_s: float = 60.0
    run_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    shutdown_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def max_samples(self) -> int | None:
        """Alias of ``max_samples_per_step_per_worker``."""
        return self.max_samples_per_step_per_worker

    @property
    def enabled(self) -> bool:
        """True when anything is recorded."""
        return bool(self.backends)

    @property
    def backends(self) -> tuple[str, ...]:
        """Backend names in force, ``arrow`` first when tracing is on."""
        names = _backend_list(self.backend)
        return (LOCAL_BACKEND, *(n for n in names if n != LOCAL_BACKEND)) if names else ()

    @property
    def project_dir(self) -> str:
        """The directory name of ``project_name`` (see :func:`dir_segment`)."""
        return dir_segment("project_name", self.project_name)

    @property
    def experiment_dir(self) -> str:
        """The directory name of ``experiment_name`` (see :func:`dir_segment`)."""
        return dir_segment("experiment_name", self.experiment_name)

    @property
    def run_dir(self) -> str:
        """Directory this config's files go to: ``output_dir/project/experiment`` (as directory names)."""
        return os.path.join(self.output_dir, self.project_dir, self.experiment_dir)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view of the config, as written into file metadata (secrets redacted)."""
        from tracer.record.redact import REDACTED, Redactor

        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        tok = self.tokenizer
        if tok is not None and not isinstance(tok, str):
            # The local folder it was loaded from (the viewer decodes with it), else ``<ClassName>``.
            path = getattr(tok, "name_or_path", None)
            local = isinstance(path, str) and path and os.path.exists(path)
            out["tokenizer"] = os.path.abspath(str(path)) if local else f"<{type(tok).__name__}>"
        if self.redact:
            # A pattern is often the literal secret itself: write how many, never what.
            out["redact_patterns"] = [REDACTED] * len(self.redact_patterns)
        data: dict[str, Any] = json.loads(json.dumps(out, default=_jsonable))
        if self.redact:
            # Secret keys' values and secret values anywhere (sk-... in backend options, a token in a URL).
            redactor = Redactor(self.redact_patterns)
            for key in ("backend_options", "run_config", "output_dir", "tokenizer"):
                data[key] = redactor.value(data[key])
        return data

    def validate(self) -> None:
        """Check every field; raise :class:`TraceConfigError` naming the first bad one."""
        valid = available_backends()
        for name in _backend_list(self.backend):
            if name not in valid:
                raise TraceConfigError(
                    f"backend: unknown backend {name!r}; valid backends are {', '.join(valid)} "
                    "(or None / 'none' to turn tracing off, or a list of them)"
                )
        for key in ("project_name", "experiment_name"):
            dir_segment(key, getattr(self, key))
        for key, choices in _CHOICES.items():
            value = getattr(self, key)
            if value not in choices:
                hint = did_you_mean([str(value)], choices)
                raise TraceConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}{hint}")
        for key, (kind, low, high, optional) in _NUMBERS.items():
            setattr(self, key, _as_number(key, getattr(self, key), kind, low, high, optional))
        for key in _BOOLS:
            setattr(self, key, as_bool(key, getattr(self, key)))
        for key in ("output_dir", "tokenizer"):
            if isinstance(getattr(self, key), os.PathLike):
                setattr(self, key, os.fspath(getattr(self, key)))
        if not isinstance(self.output_dir, str) or not self.output_dir or "\0" in self.output_dir:
            raise TraceConfigError(
                f"output_dir: {self.output_dir!r} is not a usable path; give a directory path (without NUL)"
            )
        for key in ("redact_patterns", "token_fields"):
            value = getattr(self, key)
            setattr(self, key, (value,) if isinstance(value, str) else tuple(value))
        for pattern in self.redact_patterns:
            try:
                re.compile(pattern)
            except (re.error, TypeError) as exc:
                raise TraceConfigError(
                    f"redact_patterns: {pattern!r} is not a valid regular expression: {exc}"
                ) from None
        run_config = {} if self.run_config is None else self.run_config
        if not isinstance(run_config, Mapping):
            raise TraceConfigError(
                f"run_config: a {type(self.run_config).__name__} is not a mapping; give the training config as a "
                f"dict (for an OmegaConf config: OmegaConf.to_container(cfg, resolve=True))"
            )
        self.run_config = dict(run_config)
        if self.tokenizer is not None and not isinstance(self.tokenizer, str) and not has_decode(self.tokenizer):
            raise TraceConfigError(
                f"tokenizer: a {type(self.tokenizer).__name__} cannot decode token ids (it has no batch_decode, "
                f"decode_batch or decode); give a Hugging Face tokenizer, a path to its folder or tokenizer.json, "
                f"or None to use the decorated method's self.tokenizer"
            )
        for name in self.token_fields:
            if not isinstance(name, str) or not name.endswith("_ids"):
                raise TraceConfigError(f"token_fields: {name!r} must be a field name ending in '_ids'")

    def check_resources(self) -> None:
        """Raise :class:`TraceConfigError` at :func:`tracer.init`, not at the first flush, when recording and the
        run directory cannot be created (local paths) or, with ``token2text``, the ``tokenizer`` does not decode."""
        if not self.enabled:
            return
        if not _URI_SCHEME.match(self.output_dir):
            probe = os.path.abspath(self.run_dir)
            while not os.path.exists(probe) and os.path.dirname(probe) != probe:
                probe = os.path.dirname(probe)
            if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
                why = "is not writable" if os.path.isdir(probe) else "is a file, not a directory"
                raise TraceConfigError(
                    f"output_dir: {self.output_dir!r} cannot hold the run directory {self.run_dir!r}: {probe!r} "
                    f"{why}; give a directory this user can write (output_dir=... or ${ENV_TRACE_DIR})"
                )
        if self.token2text and self.tokenizer is not None:
            _check_tokenizer(self.tokenizer)

    @classmethod
    def resolve(cls, config: TraceConfig | None = None, **fields: Any) -> TraceConfig:
        """Build the config in force: ``fields`` over ``config`` over env over defaults."""
        fields = {_ALIASES.get(k, k): v for k, v in fields.items()}
        names = {f.name for f in dataclasses.fields(cls)}
        _check_known("", fields, names | set(_ALIASES))
        if config is None:
            base: dict[str, Any] = _env_config(names)
            if os.environ.get(ENV_TRACE_DIR):
                base["output_dir"] = os.environ[ENV_TRACE_DIR]
            if ENV_BACKEND in os.environ:
                base["backend"] = _parse_backend(os.environ[ENV_BACKEND])
            from_env = set(base) - set(fields)
            base.update(fields)
            try:
                return cls(**base)
            except TraceConfigError as exc:
                field = str(exc).split(":", 1)[0]
                if field in from_env:  # say where the bad value came from
                    source = {"output_dir": ENV_TRACE_DIR, "backend": ENV_BACKEND}.get(field, ENV_CONFIG)
                    raise TraceConfigError(f"{source}: {exc}") from None
                raise
        return dataclasses.replace(config, **fields)

    @classmethod
    def from_overrides(cls, overrides: Iterable[str], base: TraceConfig | None = None) -> TraceConfig:
        """Parse verl-style ``key=value`` overrides; raise :class:`TraceConfigError` naming a bad key or value.

        Keys: ``actor_rollout_ref.rollout.trace.<field>``, ``rollout.trace.<field>``, ``trace.<field>``,
        ``trainer.project_name``/``experiment_name``/``log_val_generations`` (the trace keys win); others are ignored.
        """
        pairs: list[tuple[str, str]] = []
        for item in overrides:
            key, sep, value = str(item).lstrip("+").partition("=")
            if not sep:
                raise TraceConfigError(
                    f"override {item!r} has no '='; write it as key=value, e.g. "
                    f"actor_rollout_ref.rollout.trace.backend=arrow"
                )
            pairs.append((key.strip(), value.strip()))
        return cls._from_pairs(pairs, base)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], base: TraceConfig | None = None) -> TraceConfig:
        """Read the same keys as :meth:`from_overrides` from a YAML file, nested or dotted."""
        import yaml

        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except FileNotFoundError:
            raise TraceConfigError(f"config file {os.fspath(path)!r} does not exist") from None
        except yaml.YAMLError as exc:
            raise TraceConfigError(f"config file {os.fspath(path)!r} is not valid YAML: {exc}") from None
        if data is not None and not isinstance(data, Mapping):
            raise TraceConfigError(
                f"config file {os.fspath(path)!r} must hold a mapping of keys, not {type(data).__name__}"
            )
        return cls._from_pairs(list(_flatten(data or {})), base)

    @classmethod
    def _from_pairs(cls, pairs: list[tuple[str, Any]], base: TraceConfig | None) -> TraceConfig:
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        fields: dict[str, Any] = {}
        for key, raw in sorted(pairs, key=lambda pair: pair[0] not in _TRAINER_KEYS):  # the trace keys win
            if key in _TRAINER_KEYS:
                fields[_TRAINER_KEYS[key]] = _parse_value(key, raw, str(types[_TRAINER_KEYS[key]]))
                continue
            prefix = next((p for p in _TRACE_PREFIXES if key.startswith(p)), None)
            if prefix is None:
                continue
            name = key[len(prefix) :]
            name = _ALIASES.get(name, name)
            if name not in types:
                valid = sorted(set(types) | set(_ALIASES))
                raise TraceConfigError(
                    f"{key}: unknown trace setting {name!r}{did_you_mean([name], valid, prefix)}; valid settings are "
                    f"{', '.join(prefix + v for v in valid)}"
                )
            fields[name] = _parse_value(key, raw, str(types[name]))
        try:
            return cls.resolve(base, **fields)
        except TraceConfigError as exc:
            # Name the override key, not only the field.
            field = str(exc).split(":", 1)[0]
            spelled = next((k for k, _ in pairs if k.endswith("." + field) or k == field), field)
            raise TraceConfigError(f"{spelled}: {str(exc).split(':', 1)[1].strip()}") from None


#: Numeric fields: (int or float, lowest, highest, None allowed). Seconds stay finite and at most a
#: day (a longer wait is a mistake, and ``inf`` stops the writer's timed waits).
_MAX_SECONDS = 86_400.0
_MAX_INT = 2**63 - 1
_NUMBERS: dict[str, tuple[type, float, float, bool]] = {
    "max_tokens": (int, 1, _MAX_INT, True),
    "max_samples_per_step_per_worker": (int, 1, _MAX_INT, True),
    "sample_candidates_per_step": (int, 1, _MAX_INT, True),
    "seed": (int, -_MAX_INT, _MAX_INT, False),
    "max_file_bytes": (int, 1, _MAX_INT, False),
    "max_buffered_spans": (int, 1, _MAX_INT, False),
    "compression_level": (int, 1, 22, False),
    "log_val_generations": (int, 0, _MAX_INT, False),
    "flush_interval_s": (float, 0.001, _MAX_SECONDS, False),
    "upload_interval_s": (float, 0.001, _MAX_SECONDS, False),
    "shutdown_timeout_s": (float, 0.001, _MAX_SECONDS, False),
}
_BOOLS = ("token2text", "store_full_token", "redact")
#: The only spellings of a boolean read from text (environment, overrides, YAML strings).
_BOOL_WORDS = {"true": True, "1": True, "false": False, "0": False}
#: Longest directory name most file systems take, in bytes.
MAX_NAME_BYTES = 255


def as_bool(key: str, value: Any) -> bool:
    """``value`` as a real boolean: a bool, or the text ``true``/``false``/``1``/``0`` (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.strip().lower()]
    raise TraceConfigError(f"{key}: {value!r} is not a boolean; give true or false")


def _as_number(key: str, value: Any, kind: type, low: float, high: float, optional: bool) -> Any:
    """``value`` as a finite int or float within ``[low, high]`` (text is read); raise naming the key and range."""
    what = "an integer" if kind is int else "a number of seconds"
    if kind is not int or high < _MAX_INT:
        fix = f"give {what} from {low:g} to {high:g}"
    else:
        fix = {1: "give a positive integer", 0: "give an integer >= 0"}.get(int(low), "give an integer (64-bit)")
    fix += " (or null for no limit)" if optional else ""
    if value is None and optional:
        return None
    number: Any = value
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            number = int(text) if kind is int else float(text)
        except ValueError:
            number = None
    if kind is int and isinstance(number, float) and math.isfinite(number) and number == int(number):
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int if kind is int else (int, float)):
        raise TraceConfigError(f"{key}: {value!r} is not {what}; {fix}")
    if not (math.isfinite(number) and low <= number <= high):
        raise TraceConfigError(f"{key}: {value!r} is out of range; {fix}")
    return kind(number)


def dir_segment(key: str, name: Any) -> str:
    """The directory name of a project or experiment name (``%``, ``/``, ``\\`` as ``%25``, ``%2F``, ``%5C``);
    TraceConfigError for a name no directory can be made from (empty, NUL, line breaks, too long)."""
    if not isinstance(name, str) or not name.strip():
        raise TraceConfigError(f"{key}: {name!r} is not a usable name; give a non-empty string")
    if any(c in name for c in "\0\n\r"):
        raise TraceConfigError(f"{key}: {name!r} holds NUL or a line break; give a name without them")
    if name in (".", ".."):
        raise TraceConfigError(f"{key}: {name!r} is not a usable name; give a name other than '.' or '..'")
    segment = name.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C")
    if len(segment.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise TraceConfigError(
            f"{key}: {name[:40]!r}... is {len(segment.encode('utf-8', 'surrogatepass'))} bytes as a directory "
            f"name; give a name of at most {MAX_NAME_BYTES} bytes"
        )
    return segment


#: ``s3://``, ``gs://``, ...: output that is staged locally and uploaded.
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _jsonable(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else repr(value)


def _check_tokenizer(tokenizer: Any) -> None:
    """Raise TraceConfigError unless ``tokenizer`` (a path or an object) loads and decodes."""
    fix = (
        "give a folder with tokenizer.json, a tokenizer.json file or a tokenizer object; "
        "or token2text=False to record ids only"
    )
    tok = tokenizer
    if isinstance(tokenizer, str):
        if not os.path.exists(tokenizer):
            raise TraceConfigError(f"tokenizer: {tokenizer!r} does not exist; {fix}")
        try:
            tok = load_tokenizer(tokenizer)
        except ImportError as exc:
            raise TraceConfigError(f"tokenizer: {tokenizer!r}: {exc}") from None
        except Exception as exc:  # the libraries raise many kinds for a file they cannot read
            raise TraceConfigError(
                f"tokenizer: cannot load {tokenizer!r} ({type(exc).__name__}: {exc}); {fix}"
            ) from None
    try:
        check_decodes(tok, loaded_from_path=isinstance(tokenizer, str))
    except Exception as exc:  # a user's tokenizer may raise anything
        shown = repr(tokenizer) if isinstance(tokenizer, str) else f"a {type(tokenizer).__name__}"
        raise TraceConfigError(
            f"tokenizer: {shown} cannot decode token ids ({type(exc).__name__}: {exc}); {fix}"
        ) from None


def _check_known(where: str, fields: Iterable[str], names: set[str]) -> None:
    """Raise naming the fields not in ``names``, the closest valid ones and every valid one."""
    unknown = sorted(set(fields) - names)
    if unknown:
        raise TraceConfigError(
            f"{where}unknown config field(s) {', '.join(unknown)}{did_you_mean(unknown, names)}; "
            f"valid fields are {', '.join(sorted(names))}"
        )


def _env_config(names: set[str]) -> dict[str, Any]:
    """The fields given as JSON in ``ROLLOUT_TRACE_CONFIG`` (empty when unset)."""
    raw = os.environ.get(ENV_CONFIG, "").strip()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TraceConfigError(
            f'{ENV_CONFIG}: not valid JSON ({exc}); give an object like {{"max_tokens": 4096}}'
        ) from None
    if not isinstance(data, dict):
        raise TraceConfigError(f"{ENV_CONFIG}: must be a JSON object of config fields, not {type(data).__name__}")
    data = {_ALIASES.get(k, k): v for k, v in data.items()}
    _check_known(f"{ENV_CONFIG}: ", data, names)
    return data


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and not full.endswith(("backend_options", "run_config")):
            yield from _flatten(value, full + ".")
        else:
            yield full, value


_NONE_WORDS = {"none", "null", "~", ""}


def _backend_list(backend: str | list[str] | tuple[str, ...] | None) -> list[str]:
    items = () if backend is None else [backend] if isinstance(backend, str) else backend
    parts = (part.strip().lower() for item in items for part in str(item).split(","))
    return [part for part in parts if part not in _NONE_WORDS]


def _parse_backend(raw: Any) -> str | list[str] | None:
    if raw is not None and not isinstance(raw, (list, tuple)):
        text = str(raw).strip()
        text = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        raw = [t.strip().strip("'\"") for t in text.split(",")]
    names = _backend_list(raw)
    return (names[0] if len(names) == 1 else names) or None


def _parse_value(key: str, raw: Any, type_name: str) -> Any:
    """Parse ``raw`` to the field's type; ``type_name`` is the annotation text."""
    if key.endswith("backend"):
        return _parse_backend(raw)
    text = raw.strip() if isinstance(raw, str) else None
    optional = "None" in type_name
    if raw is None or (optional and text is not None and text.lower() in _NONE_WORDS):
        if optional or type_name == "Any":
            return None
        raise TraceConfigError(f"{key}: null is not allowed here; give a {type_name} value")
    if type_name.startswith("tuple"):
        if isinstance(raw, (list, tuple)):
            return tuple(str(x) for x in raw)
        assert text is not None
        body = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        return tuple(p.strip().strip("'\"") for p in body.split(",") if p.strip())
    if type_name.startswith("dict"):
        try:
            return dict(raw) if isinstance(raw, Mapping) else dict(json.loads(text or "{}"))
        except (ValueError, TypeError):
            raise TraceConfigError(f"{key}: cannot read {raw!r}; give a JSON object") from None
    if type_name == "str":
        return str(raw)
    # bool, int, float: read and checked with every other source's values (TraceConfig.validate); Any: as given
    return text if text is not None and type_name == "Any" else raw
