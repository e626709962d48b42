"""Config loading: defaults equal the documented YAML, errors name file and key, env overrides work."""

import os
import subprocess
import sys

import pytest

from gatherwise.config import ConfigError, DelayPhase, GatherwiseConfig, config_hash, load_config
from tests._repo import ROOT


def test_documented_yaml_equals_defaults():
    assert load_config(ROOT / "config" / "gatherwise.yaml", env={}) == GatherwiseConfig()


@pytest.mark.parametrize("example", [*sorted((ROOT / "config").glob("*.yaml")), ROOT / "dashboards" / "demo.yaml"],
                         ids=lambda p: p.name)
def test_every_shipped_config_loads(example):
    load_config(example, env={})


@pytest.mark.parametrize(("text", "message"), [
    ("sidecar:\n  prot: 1\n", "sidecar.prot: unknown key"),
    ("sidecars:\n  port: 1\n", "unknown section 'sidecars'"),
    ("sidecar:\n  port: '80'\n", "sidecar.port: must be int"),
    ("sidecar:\n  port: 70000\n", "sidecar.port: must be in"),
    ("policy:\n  mode: fast\n", "policy.mode: must be one of manual, auto"),
    ("engine:\n  initial_mode: scatter\n", "engine.initial_mode"),
    ("telemetry:\n  enabled: 1\n", "telemetry.enabled: must be bool"),
    ("control:\n  inject_delay: [{after_seconds: 0, mode: fast, seconds: 1}]\n", "control.inject_delay[0]"),
    ("- a\n- b\n", "top level must be a mapping"),
    ("engine: [1\n", "cannot read config"),
    ("control:\n  inject_delay: [{after_seconds: 0, mode: gather}]\n", "control.inject_delay[0].seconds: missing"),
    ("control:\n  inject_delay: [{after_seconds: 0, mode: gather, seconds: 1, x: 1}]\n",
     "control.inject_delay[0].x: unknown key (known: after_seconds, mode, seconds)"),
    ("control:\n  inject_delay: [{after_seconds: -1, mode: gather, seconds: 1}]\n",
     "control.inject_delay[0].after_seconds: must be >= 0"),
    ("policy:\n  margin: .nan\n", "policy.margin: must be a finite number"),
    ("policy:\n  window:\n", "policy.window: must not be empty"),
    ("engine:\n  graph_modes: gather,scatter\n", "engine.graph_modes: must be comma-separated labels"),
    ("engine:\n  graph_modes: all_gather,sharded\n", "engine.graph_modes: 'sharded' cannot be captured"),
    ("sidecar: 5\n", "sidecar: must be a mapping, got int"),
    ("engine:\n  sampler: torch\n", "engine.sampler: must be one of engine, gatherwise"),
    ("engine:\n  sampler_seed: -1\n", "engine.sampler_seed: must be >= 0"),
])
def test_bad_config_names_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_environment_overrides_and_names_itself_in_errors(tmp_path):
    cfg = load_config(None, env={"GATHERWISE_SIDECAR_PORT": "9500", "GATHERWISE_POLICY_MODE": "auto",
                                 "GATHERWISE_ENABLE": "1", "GATHERWISE_API_TOKEN": "x",
                                 "GATHERWISE_CONTROL_INJECT_DELAY": "[{after_seconds: 1, mode: gather, seconds: 0.5}]"})
    assert cfg.sidecar.port == 9500 and cfg.policy.mode == "auto"
    assert cfg.control.inject_delay == (DelayPhase(after_seconds=1.0, mode="gather", seconds=0.5),)
    with pytest.raises(ConfigError, match="environment variable GATHERWISE_TRACES_SAMPLE_RATIO"):
        load_config(None, env={"GATHERWISE_TRACES_SAMPLE_RATIO": "2"})


def test_config_hash_covers_what_ranks_must_share():
    base = GatherwiseConfig()
    assert config_hash(base) == config_hash(load_config(None, env={"GATHERWISE_SIDECAR_PORT": "1"}))
    assert config_hash(base) != config_hash(load_config(None, env={"GATHERWISE_ENGINE_LOGITS_DTYPE": "bfloat16"}))


def test_environment_values_of_string_keys_are_strings():
    cfg = load_config(None, env={"GATHERWISE_SIDECAR_API_TOKEN": "#secret", "GATHERWISE_ENGINE_SHM_DIR": "/x: [y"})
    assert cfg.sidecar.api_token == "#secret" and cfg.engine.shm_dir == "/x: [y"
    assert load_config(None, env={"GATHERWISE_SIDECAR_API_TOKEN": "123"}).sidecar.api_token == "123"
    assert load_config(None, env={"GATHERWISE_SIDECAR_API_TOKEN": ""}).sidecar.api_token is None


@pytest.mark.parametrize("value", ["[", "{a: 1", "'unclosed"])
def test_invalid_yaml_in_the_environment_names_the_variable(value):
    with pytest.raises(ConfigError, match="environment variable GATHERWISE_POLICY_MARGIN"):
        load_config(None, env={"GATHERWISE_POLICY_MARGIN": value})


def test_non_utf8_config_file_names_the_file(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("sidecar:\n  api_token: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=f"{path}: not UTF-8"):
        load_config(path, env={})


def test_every_error_of_a_file_is_reported_each_with_its_origin(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("policy:\n  window: 2\n  probe_calls: 1.5\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={"GATHERWISE_SIDECAR_PORT": "-1"})
    lines = str(err.value).splitlines()
    assert f"{path}: policy.window: must be in [8, 1048576], got 2" in lines
    assert f"{path}: policy.probe_calls: must be int, got float 1.5" in lines
    assert "environment variable GATHERWISE_SIDECAR_PORT: sidecar.port: must be in [0, 65535], got -1" in lines


def test_an_empty_section_keeps_its_defaults_and_takes_environment_overrides(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("policy:\n")
    assert load_config(path, env={"GATHERWISE_POLICY_MARGIN": "0.5"}).policy.margin == 0.5


def test_replace_validates_like_loading():
    cfg = GatherwiseConfig()
    assert cfg.replace(sidecar=cfg.sidecar.replace(port=1)).sidecar.port == 1
    with pytest.raises(ConfigError, match=r"SidecarSection.port: must be in \[0, 65535\], got 70000"):
        cfg.sidecar.replace(port=70000)


def test_policy_parameters_are_declared_once_and_the_api_derives_from_them():
    """Config keys, GET /v1/policy's params and PUT /v1/policy's body: one declaration, same ranges."""
    from gatherwise.config import PolicyParams, PolicySection
    from gatherwise.sidecar.api.control_models import PolicyResponse, PolicyUpdate

    assert PolicyResponse.model_fields["params"].annotation is PolicyParams and issubclass(PolicySection, PolicyParams)
    assert GatherwiseConfig().policy.params == PolicyParams()
    for name, field in PolicyParams.model_fields.items():
        update = PolicyUpdate.model_fields[name]
        assert update.default is None and update.metadata == field.metadata, name
    assert set(PolicyUpdate.model_fields) == set(PolicyParams.model_fields)


def test_engine_sampler_defaults_to_the_engines_own_and_is_set_by_its_variable():
    assert GatherwiseConfig().engine.sampler == "engine"
    cfg = load_config(None, env={"GATHERWISE_ENGINE_SAMPLER": "gatherwise", "GATHERWISE_ENGINE_SAMPLER_SEED": "7"})
    assert cfg.engine.sampler == "gatherwise" and cfg.engine.sampler_seed == 7
    with pytest.raises(ConfigError, match="environment variable GATHERWISE_ENGINE_SAMPLER"):
        load_config(None, env={"GATHERWISE_ENGINE_SAMPLER": "Gatherwise"})


def test_a_graph_mode_no_graph_can_hold_is_one_line_and_exit_2(tmp_path):
    """engine.graph_modes naming sharded is refused when the config loads, like any bad key: one line, exit 2."""
    env = {**os.environ, "GATHERWISE_ENGINE_GRAPH_MODES": "all_gather,sharded"}
    proc = subprocess.run([sys.executable, "-m", "gatherwise.cli", "sidecar", "--port", "0", "--shm-dir",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "engine.graph_modes" in lines[0] and "'sharded' cannot be captured" in lines[0], lines
