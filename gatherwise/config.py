"""One configuration schema for engine hooks and sidecar (config/gatherwise.yaml documents every key).

Each key's type, default and range are stated once, in its Field below; pydantic validates them, and the
sidecar's API models derive from the same classes (sidecar/api/control_models.py), so a range cannot differ
between the config file and the API. Loading validates everything: an unknown key, a wrong type or an
out-of-range value raises ConfigError naming the file and the key. Environment variables
GATHERWISE_<SECTION>_<KEY> override keys: the value of a string key is taken verbatim
(`GATHERWISE_SIDECAR_API_TOKEN='#secret'` is the token `#secret`, not a YAML comment), any other key's value is
parsed as YAML (numbers, true/false, lists); an empty value means "unset". Every error names the file or the
variable it came from. pydantic + pyyaml only: the engine side imports this module too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args, get_origin
from urllib.parse import urlsplit

from annotated_types import Ge, Le
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from typing_extensions import Self

from gatherwise.bounded_yaml import NotUTF8Error, YAMLInputError, parse_yaml, read_yaml_file, short, short_message
from gatherwise.logits_dtypes import LOGITS_DTYPES
from gatherwise.modes import CAPTURABLE_LABELS, IMPLEMENTED_LABELS
from gatherwise.stable_hash import stable_hash
from gatherwise.validation_errors import dotted_location, error_text, joined_errors

DEFAULT_SHM_DIR = "/dev/shm/gatherwise"
ENV_PREFIX = "GATHERWISE_"

# Generated from gatherwise.modes.IMPLEMENTED: a mode the engine implements is accepted here and in the API (its
# OpenAPI enum) without another change; a reserved one is refused with the list of valid values.
ModeLabel = Literal[IMPLEMENTED_LABELS]  # type: ignore[valid-type]
MODE_OR_AUTO_LABELS = (*IMPLEMENTED_LABELS, "auto")
ModeOrAuto = Literal[MODE_OR_AUTO_LABELS]  # type: ignore[valid-type]
PolicyMode = Literal["manual", "auto"]


class ConfigError(ValueError):
    pass


class Schema(BaseModel):
    """Frozen, and strict like the API's request bodies: YAML's 1 is not true, '80' is not a port, .nan is no
    number (strict still takes an integer where a float is expected)."""

    # A response always carries every field: the OpenAPI schema says so (required) although each has a default.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False,
                              json_schema_serialization_defaults_required=True)

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes`, validated like a loaded file (what dataclasses.replace was for dataclasses)."""
        try:
            return type(self).model_validate({**dict(self), **changes})
        except ValidationError as exc:
            raise ConfigError(joined_errors(exc, lambda e: f"{type(self).__name__}.{dotted_location(e['loc'])}: "
                                                           f"{_problem(e, *_schema_at(e['loc'], type(self)))}")
                              ) from None


def _mode_labels(value: str) -> str:
    labels = [part.strip() for part in value.split(",") if part.strip()]
    if not labels or not all(label in IMPLEMENTED_LABELS for label in labels):
        raise ValueError(f"must be comma-separated labels from {', '.join(IMPLEMENTED_LABELS)}, got {value!r}")
    return value


def _graph_mode_labels(value: str) -> str:
    """engine.graph_modes: implemented modes that a CUDA graph can hold (refused here, at load, rather than when
    an engine's plugin installs)."""
    _mode_labels(value)
    for label in (part.strip() for part in value.split(",") if part.strip()):
        if label not in CAPTURABLE_LABELS:
            raise ValueError(f"{label!r} cannot be captured in a CUDA graph (capturable: "
                             f"{', '.join(CAPTURABLE_LABELS)}); its steps run eagerly anyway, leave it out")
    return value


def _table_file(path: str | None) -> str | None:
    """engine.initial_table_file: read and checked when the config is loaded, so a file that is missing, is no
    regular file or holds no table refuses the config (one line) instead of stopping every rank at install."""
    if path:
        from gatherwise.table_file import load_table_file

        try:
            load_table_file(path)
        except OSError as exc:
            raise ValueError(f"cannot read table file {short(path)}: {exc.strerror or exc}") from None
    return path


def _otlp_url(value: str | None) -> str | None:
    """traces.otlp_endpoint: an http(s) URL with a host, refused at load rather than by every export batch."""
    if value:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 -- parsing the port is the check: ValueError when it is no port
        except ValueError as exc:
            raise ValueError(f"{short(value)} is not a URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http:// or https:// URL with a host (OTLP over HTTP), got {short(value)}")
    return value


class DelayPhase(Schema):
    """Test/bench only: from `after_seconds` after engine start, add `seconds` to every `mode` collective."""

    after_seconds: float = Field(ge=0.0)
    mode: ModeLabel
    seconds: float = Field(ge=0.0)


class EngineSection(Schema):
    shm_dir: str = DEFAULT_SHM_DIR
    initial_mode: ModeLabel = "all_gather"
    initial_table_file: Annotated[str | None, AfterValidator(_table_file)] = None
    logits_dtype: Literal[LOGITS_DTYPES] = "float32"  # type: ignore[valid-type]
    # modes SGLang captures a decode CUDA graph for (graph memory x each)
    graph_modes: Annotated[str, AfterValidator(_graph_mode_labels)] = "all_gather,gather"
    # who samples the engine's sampled batches: its own sampler, or gatherwise's mode-independent one (every
    # mode, sharded included; tokens keyed by (sampler_seed, request, position)); docs/sglang.md, docs/vllm.md
    sampler: Literal["engine", "gatherwise"] = "engine"
    # the seed of gatherwise's sampler for requests without a seed of their own
    sampler_seed: int = Field(default=0, ge=0, lt=1 << 63)


class TelemetrySection(Schema):
    enabled: bool = True
    ring_capacity: int = Field(8192, ge=16, le=1 << 22)


class ControlSection(Schema):
    enabled: bool = True
    inject_delay: tuple[DelayPhase, ...] = Field((), strict=False)  # lax only to take YAML's list for the tuple


class SidecarSection(Schema):
    host: str = "127.0.0.1"
    port: int = Field(9400, ge=0, le=65535)
    poll_interval_seconds: float = Field(0.02, ge=0.001, le=10.0)
    api_token: str | None = None
    heartbeat_stale_seconds: float = Field(5.0, ge=0.1, le=3600.0)
    max_records_per_poll: int = Field(16384, ge=64, le=1 << 22)
    header_timeout_seconds: float = Field(10.0, ge=0.1, le=3600.0)  # a request's headers, then its body, within this
    # the Host header names answered (DNS rebinding); empty: the bound address (and localhost names when it is
    # loopback; any name when it is 0.0.0.0 or ::); "*": any
    allowed_hosts: tuple[str, ...] = Field((), strict=False)  # lax only to take YAML's list for the tuple


class TracesSection(Schema):
    enabled: bool = True
    sample_ratio: float = Field(0.01, ge=0.0, le=1.0)
    every_nth: int = Field(0, ge=0, le=1 << 30)
    otlp_endpoint: Annotated[str | None, AfterValidator(_otlp_url)] = None
    service_name: str = "gatherwise-sidecar"


# The one declaration of the auto policy's parameters (sidecar/policy/) and their ranges: config keys of the
# policy section, GET /v1/policy's params, and (every field optional: sidecar/api/control_models.py PolicyUpdate)
# the body of PUT /v1/policy.
class PolicyParams(Schema):
    """The auto policy's parameters (config section `policy`; PUT /v1/policy takes any subset)."""

    margin: float = Field(0.05, ge=0.0, le=10.0, description="switch when the other mode is faster by this fraction")
    min_samples: int = Field(30, ge=1, le=1 << 20, description="samples needed on both sides before switching")
    window: int = Field(256, ge=8, le=1 << 20, description="newest samples kept per bucket and mode")
    dwell_seconds: float = Field(5.0, ge=0.0, le=86400.0, description="minimum time between two switches of one "
                                                                      "bucket")
    probe_interval_seconds: float = Field(10.0, ge=0.0, le=86400.0,
                                          description="minimum time between two probes of one bucket")
    probe_calls: int = Field(8, ge=1, le=1 << 20, description="calls per probe")
    probe_budget: float = Field(0.02, ge=0.0, le=1.0, description="max share of all observed seconds that probes "
                                                                  "may add (a probe of a faster mode adds none)")
    max_sample_age_seconds: float = Field(120.0, ge=0.1, le=86400.0,
                                          description="samples older than this leave the estimates")
    probe_backoff_max: float = Field(16.0, ge=1.0, le=1024.0,
                                     description="a mode far behind, or settled slower by more than margin, is "
                                                 "probed up to this many times less often")
    probe_backoff_margin: float = Field(0.25, ge=0.0, le=10.0,
                                        description="far behind = slower than the chosen mode by this fraction; "
                                                    "the chosen mode's cost moving by it ends the back-off")
    cost: Literal["step", "path"] = Field(
        "step", description="what a call costs its mode: step = from its start to the next call's start (the "
                            "logits path and whatever the mode does to the rest of the engine's step), path = the "
                            "logits path's critical path alone")

    @property
    def probe_timeout_seconds(self) -> float:
        """A probe of a bucket whose traffic stopped ends after this long anyway."""
        return max(2.0, 2.0 * self.probe_interval_seconds)


class PolicySection(PolicyParams):
    mode: PolicyMode = "manual"
    table_file: str | None = None

    @property
    def params(self) -> PolicyParams:
        return PolicyParams(**{name: getattr(self, name) for name in PolicyParams.model_fields})


class GatherwiseConfig(Schema):
    engine: EngineSection = Field(default_factory=EngineSection)
    telemetry: TelemetrySection = Field(default_factory=TelemetrySection)
    control: ControlSection = Field(default_factory=ControlSection)
    sidecar: SidecarSection = Field(default_factory=SidecarSection)
    traces: TracesSection = Field(default_factory=TracesSection)
    policy: PolicySection = Field(default_factory=PolicySection)


def _sections() -> dict[str, type[Schema]]:
    """GatherwiseConfig's sections by name: each field's annotation, which must be a Schema."""
    sections: dict[str, type[Schema]] = {}
    for name, f in GatherwiseConfig.model_fields.items():
        schema = f.annotation
        if not (isinstance(schema, type) and issubclass(schema, Schema)):
            raise TypeError(f"GatherwiseConfig.{name} is no config section: {schema!r}")
        sections[name] = schema
    return sections


SECTIONS = _sections()


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> GatherwiseConfig:
    """Defaults, then the YAML file (`path`, else env GATHERWISE_CONFIG), then GATHERWISE_<SECTION>_<KEY> overrides."""
    env = os.environ if env is None else env
    path = path if path is not None else env.get("GATHERWISE_CONFIG") or None
    source = str(path) if path is not None else "<defaults>"
    raw = _read_yaml(path, source) if path is not None else {}
    # an empty section (`policy:` alone) keeps its defaults
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items() if v is not None}
    origins: dict[tuple[str, str], str] = {}  # keys set from the environment, to name them in errors
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        section = next((s for s in SECTIONS if rest.startswith(s + "_")), None)
        if section is None:
            continue  # other GATHERWISE_* variables (GATHERWISE_ENABLE, GATHERWISE_API_TOKEN) are not config keys
        entry = raw.setdefault(section, {})
        if not isinstance(entry, dict):
            raise ConfigError(f"{source}: {section}: must be a mapping, got {type(entry).__name__}")
        key = rest[len(section) + 1:]
        entry[key] = _env_value(name, value, SECTIONS[section].model_fields.get(key))
        origins[(section, key)] = f"environment variable {name}"
    try:
        return GatherwiseConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(joined_errors(exc, lambda e: _explain(e, source, origins), "\n")) from None


def _read_yaml(path: str | os.PathLike[str], source: str) -> dict[Any, Any]:
    try:
        raw = read_yaml_file(path) or {}
    except NotUTF8Error as exc:
        raise ConfigError(f"{source}: {exc.reason}") from None
    except YAMLInputError as exc:
        raise ConfigError(f"{source}: cannot read config: {exc.reason}") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read config: {exc.strerror or exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections")
    return raw


def _is_text(field: FieldInfo | None) -> bool:
    """A key whose values are strings (str, str | None, a Literal of strings): its variable is taken verbatim."""
    if field is None:
        return False
    hint, args = field.annotation, get_args(field.annotation)
    if get_origin(hint) is Literal:
        return all(isinstance(a, str) for a in args)
    if get_origin(hint) in (tuple, list):  # a list of strings is written as a YAML list
        return False
    return hint is str or str in args


def _env_value(name: str, value: str, field: FieldInfo | None) -> Any:
    """A string key's value verbatim; any other key's value parsed as YAML. Errors name the variable."""
    if value == "":
        return None
    if _is_text(field):
        return value
    try:
        return parse_yaml(value)
    except YAMLInputError as exc:
        raise ConfigError(f"environment variable {name}: {short(value)} is not a valid value ({exc.reason})") from None


def _explain(error: ErrorDetails, source: str, origins: Mapping[tuple[str, str], str]) -> str:
    """One pydantic error as `<file or variable>: <section>.<key>[i].<sub>: <problem>`."""
    loc = error["loc"]
    if len(loc) == 1:
        if error["type"] == "extra_forbidden":
            return f"{source}: unknown section {loc[0]!r} (known: {', '.join(SECTIONS)})"
        return f"{source}: {loc[0]}: must be a mapping, got {type(error['input']).__name__}"
    section, key = loc[0], loc[1]
    where = f"{origins.get((str(section), str(key)), source)}: {section}.{key}"
    where += "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[2:])
    return f"{where}: {_problem(error, *_schema_at(loc))}"


def _schema_at(loc: tuple[Any, ...], root: Any = None) -> tuple[Any, FieldInfo | None]:
    """(model, field) an error location points at: the field of its last key (None for an unknown key) and the
    model that holds, or should hold, that key."""
    holder: Any = root or GatherwiseConfig
    field: FieldInfo | None = None
    for part in loc:
        if field is not None:  # step into the field's model (or, for a tuple of models, the item's model)
            inner = field.annotation
            holder = next((a for a in (inner, *get_args(inner)) if isinstance(a, type) and issubclass(a, BaseModel)),
                          None)
            field = None
        if isinstance(part, int):
            continue
        field = getattr(holder, "model_fields", {}).get(part)
        if field is None:
            break
    return holder, field


_TYPE_NAMES = {"int_type": "int", "int_parsing": "int", "int_from_float": "int", "bool_type": "bool",
               "bool_parsing": "bool", "float_type": "float", "float_parsing": "float", "string_type": "str",
               "tuple_type": "a list", "list_type": "a list", "model_type": "a mapping", "dict_type": "a mapping"}


def _problem(error: ErrorDetails, holder: Any, field: FieldInfo | None) -> str:
    """What is wrong, in a few words ("must be int, got str '80'", "must be in [0, 65535]")."""
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        known = list(getattr(holder, "model_fields", {}))
        return f"unknown key (known: {', '.join(known)})" if known else "unknown key"
    if kind == "missing":
        return "missing (this key has no default)"
    if value is None and kind != "literal_error":
        return "must not be empty"
    if kind in _TYPE_NAMES:
        return f"must be {_TYPE_NAMES[kind]}, got {type(value).__name__} {short(value)}"
    if kind == "literal_error" and field is not None:
        choices = [a for a in get_args(field.annotation) if a is not None and a is not type(None)]
        return f"must be one of {', '.join(map(str, choices))}, got {short(value)}"
    if kind in ("greater_than_equal", "less_than_equal") and field is not None:
        lo = next((m.ge for m in field.metadata if isinstance(m, Ge)), None)
        hi = next((m.le for m in field.metadata if isinstance(m, Le)), None)
        return f"must be in [{lo}, {hi}], got {short(value)}" if hi is not None else \
            f"must be >= {lo}, got {short(value)}"
    if kind == "finite_number":
        return f"must be a finite number, got {short(value)}"
    return short_message(error_text(error))


def config_hash(cfg: GatherwiseConfig) -> int:
    """Hash of what every rank must agree on (engine and control sections), for the install handshake."""
    blob = json.dumps({"engine": cfg.engine.model_dump(), "control": cfg.control.model_dump()}, sort_keys=True)
    return stable_hash(blob)
