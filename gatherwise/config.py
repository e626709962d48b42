"""One configuration schema for engine hooks and sidecar (config/gatherwise.yaml documents every key).

Loading validates everything: an unknown key, a wrong type or an out-of-range value raises ConfigError naming
the file and the key. Environment variables GATHERWISE_<SECTION>_<KEY> override keys: the value of a string key
is taken verbatim (`GATHERWISE_SIDECAR_API_TOKEN='#secret'` is the token `#secret`, not a YAML comment), any
other key's value is parsed as YAML (numbers, true/false, lists); an empty value means "unset". Every error names
the file or the variable it came from.
Stdlib + pyyaml only: the sidecar imports this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from gatherwise.modes import IMPLEMENTED_LABELS

DEFAULT_SHM_DIR = "/dev/shm/gatherwise"
ENV_PREFIX = "GATHERWISE_"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class DelayPhase:
    """Test/bench only: from `after_seconds` after engine start, add `seconds` to every `mode` collective."""

    after_seconds: float
    mode: str
    seconds: float


@dataclass(frozen=True)
class EngineSection:
    shm_dir: str = DEFAULT_SHM_DIR
    initial_mode: str = "all_gather"
    initial_table_file: str | None = None
    logits_dtype: str = "float32"
    graph_modes: str = "all_gather,gather"  # modes SGLang captures a decode CUDA graph for (graph memory x each)


@dataclass(frozen=True)
class TelemetrySection:
    enabled: bool = True
    ring_capacity: int = 8192


@dataclass(frozen=True)
class ControlSection:
    enabled: bool = True
    inject_delay: tuple[DelayPhase, ...] = ()


@dataclass(frozen=True)
class SidecarSection:
    host: str = "127.0.0.1"
    port: int = 9400
    poll_interval_seconds: float = 0.02
    api_token: str | None = None
    heartbeat_stale_seconds: float = 5.0
    max_records_per_poll: int = 16384


@dataclass(frozen=True)
class TracesSection:
    enabled: bool = True
    sample_ratio: float = 0.01
    every_nth: int = 0
    otlp_endpoint: str | None = None
    service_name: str = "gatherwise-sidecar"


@dataclass(frozen=True)
class PolicySection:
    mode: str = "manual"
    margin: float = 0.05
    min_samples: int = 30
    window: int = 256
    dwell_seconds: float = 5.0
    probe_interval_seconds: float = 10.0
    probe_calls: int = 8
    probe_budget: float = 0.02
    max_sample_age_seconds: float = 120.0
    probe_backoff_max: float = 16.0
    probe_backoff_margin: float = 0.25
    table_file: str | None = None


@dataclass(frozen=True)
class GatherwiseConfig:
    engine: EngineSection = field(default_factory=EngineSection)
    telemetry: TelemetrySection = field(default_factory=TelemetrySection)
    control: ControlSection = field(default_factory=ControlSection)
    sidecar: SidecarSection = field(default_factory=SidecarSection)
    traces: TracesSection = field(default_factory=TracesSection)
    policy: PolicySection = field(default_factory=PolicySection)


# Range and choice rules: (section, key) -> check returning an error message or None.
def _in(choices: tuple[str, ...]) -> Any:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"


def _labels_in(choices: tuple[str, ...]) -> Any:
    def check(v: str) -> str | None:
        labels = [part.strip() for part in v.split(",") if part.strip()]
        if labels and all(label in choices for label in labels):
            return None
        return f"must be comma-separated labels from {', '.join(choices)}, got {v!r}"
    return check


def _between(lo: float, hi: float) -> Any:
    return lambda v: None if lo <= v <= hi else f"must be in [{lo}, {hi}], got {v!r}"


_RULES: dict[tuple[str, str], Any] = {
    ("engine", "initial_mode"): _in(IMPLEMENTED_LABELS),
    ("engine", "graph_modes"): _labels_in(IMPLEMENTED_LABELS),
    ("engine", "logits_dtype"): _in(("float32", "bfloat16", "float16")),
    ("telemetry", "ring_capacity"): _between(16, 1 << 22),
    ("sidecar", "port"): _between(0, 65535),
    ("sidecar", "poll_interval_seconds"): _between(0.001, 10.0),
    ("sidecar", "heartbeat_stale_seconds"): _between(0.1, 3600.0),
    ("sidecar", "max_records_per_poll"): _between(64, 1 << 22),
    ("traces", "sample_ratio"): _between(0.0, 1.0),
    ("traces", "every_nth"): _between(0, 1 << 30),
    ("policy", "mode"): _in(("manual", "auto")),
    ("policy", "margin"): _between(0.0, 10.0),
    ("policy", "min_samples"): _between(1, 1 << 20),
    ("policy", "window"): _between(8, 1 << 20),
    ("policy", "dwell_seconds"): _between(0.0, 86400.0),
    ("policy", "probe_interval_seconds"): _between(0.0, 86400.0),
    ("policy", "probe_calls"): _between(1, 1 << 20),
    ("policy", "probe_budget"): _between(0.0, 1.0),
    ("policy", "max_sample_age_seconds"): _between(0.1, 86400.0),
    ("policy", "probe_backoff_max"): _between(1.0, 1024.0),
    ("policy", "probe_backoff_margin"): _between(0.0, 10.0),
}


def load_config(path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> GatherwiseConfig:
    """Defaults, then the YAML file (`path`, else env GATHERWISE_CONFIG), then GATHERWISE_<SECTION>_<KEY> overrides."""
    env = os.environ if env is None else env
    path = path if path is not None else env.get("GATHERWISE_CONFIG") or None
    source = str(path) if path is not None else "<defaults>"
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_bytes().decode("utf-8")) or {}
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start}): a config file must be UTF-8") from None
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{source}: cannot read config: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: top level must be a mapping of sections")
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    sections = {f.name: f.type for f in fields(GatherwiseConfig)}
    origins: dict[tuple[str, str], str] = {}  # keys set from the environment, to name them in errors
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        section = next((s for s in sections if rest.startswith(s + "_")), None)
        if section is None:
            continue  # other GATHERWISE_* variables (GATHERWISE_ENABLE, GATHERWISE_API_TOKEN) are not config keys
        entry = raw.setdefault(section, {})
        if not isinstance(entry, dict):
            raise ConfigError(f"{source}: {section}: must be a mapping")
        key = rest[len(section) + 1:]
        entry[key] = _env_value(name, value, get_type_hints(_section_class(section)).get(key))
        origins[(section, key)] = f"environment variable {name}"

    built = {}
    for name, value in raw.items():
        if name not in sections:
            raise ConfigError(f"{source}: unknown section {name!r} (known: {', '.join(sections)})")
        cls = _section_class(name)
        built[name] = _build_section(source, name, cls, value, origins)
    return GatherwiseConfig(**built)


def _section_class(section: str) -> Any:
    return GatherwiseConfig.__dataclass_fields__[section].default_factory


def _env_value(name: str, value: str, hint: Any) -> Any:
    """A string key's value verbatim; any other key's value parsed as YAML. Errors name the variable."""
    if value == "":
        return None
    if hint is not None and str in (get_args(hint) or (hint,)):
        return value
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"environment variable {name}: {value!r} is not a valid value ({problem})") from None


def _build_section(source: str, section: str, cls: Any, values: Any, origins: dict[tuple[str, str], str]) -> Any:
    if values is None:
        return cls()
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: {section}: must be a mapping, got {type(values).__name__}")
    hints = get_type_hints(cls)
    out = {}
    for key, value in values.items():
        where = f"{origins.get((section, key), source)}: {section}.{key}"
        if key not in hints:
            raise ConfigError(f"{where}: unknown key (known: {', '.join(hints)})")
        value = _coerce(where, hints[key], value)
        rule = _RULES.get((section, key))
        problem = rule(value) if rule and value is not None else None
        if problem:
            raise ConfigError(f"{where}: {problem}")
        out[key] = value
    return cls(**out)


def _coerce(where: str, hint: Any, value: Any) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Union or type(hint).__name__ == "UnionType":
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
        origin, args = get_origin(hint), get_args(hint)
    if origin is tuple:  # tuple[DelayPhase, ...]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: must be a list, got {type(value).__name__}")
        return tuple(_coerce(f"{where}[{i}]", args[0], v) for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: must be a mapping, got {type(value).__name__}")
        known = get_type_hints(hint)
        unknown = set(value) - set(known)
        if unknown or set(known) - set(value):
            raise ConfigError(f"{where}: needs exactly the keys {', '.join(known)}")
        item = hint(**{k: _coerce(f"{where}.{k}", known[k], v) for k, v in value.items()})
        if isinstance(item, DelayPhase):
            if item.mode not in IMPLEMENTED_LABELS or item.seconds < 0 or item.after_seconds < 0:
                raise ConfigError(f"{where}: needs a known mode and non-negative after_seconds/seconds")
        return item
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    if value is None:
        raise ConfigError(f"{where}: must not be empty")
    raise ConfigError(f"{where}: must be {getattr(hint, '__name__', hint)}, got {type(value).__name__} {value!r}")


def config_hash(cfg: GatherwiseConfig) -> int:
    """Hash of what every rank must agree on (engine and control sections), for the install handshake."""
    blob = json.dumps({"engine": dataclasses.asdict(cfg.engine), "control": dataclasses.asdict(cfg.control)},
                      sort_keys=True)
    return int.from_bytes(hashlib.blake2b(blob.encode(), digest_size=8).digest(), "little") >> 1
