"""Broken configuration reaches the real commands as one clear line naming the file or the variable, never a
traceback; a string key's environment value is taken verbatim."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests._sidecar import GATHERWISE, ROOT, start_sidecar, wait_for

pytestmark = [pytest.mark.timeout(300)]


def run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GATHERWISE, *args], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("command", [["sidecar", "--port", "0"], ["engine", "--tp", "1", "--duration", "1"]])
def test_invalid_yaml_in_the_environment(command, tmp_path):
    result = run([*command, "--shm-dir", str(tmp_path / "shm")], GATHERWISE_POLICY_MARGIN="[")
    assert result.returncode == 2
    assert "environment variable GATHERWISE_POLICY_MARGIN" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["sidecar", "--port", "0"], ["engine", "--tp", "1", "--duration", "1"]])
def test_non_utf8_config_file(command, tmp_path):
    config = tmp_path / "latin1.yaml"
    config.write_bytes("sidecar:\n  api_token: caf\xe9\n".encode("latin-1"))
    result = run([*command, "--config", str(config), "--shm-dir", str(tmp_path / "shm")])
    assert result.returncode == 2
    assert f"{config}: not UTF-8" in result.stderr and "Traceback" not in result.stderr


def test_token_that_looks_like_a_yaml_comment_is_the_token(shm_dir):
    import httpx

    proc, url = start_sidecar(shm_dir, env_extra={"GATHERWISE_SIDECAR_API_TOKEN": "#secret"})
    try:
        wait_for(lambda: httpx.get(f"{url}/healthz", timeout=10).status_code == 200, 60, "the sidecar to serve")
        body = {"margin": 0.1}
        assert httpx.put(f"{url}/v1/policy", json=body, timeout=10).status_code == 401  # a token is configured
        wrong = httpx.put(f"{url}/v1/policy", json=body, headers={"Authorization": "Bearer secret"}, timeout=10)
        assert wrong.status_code == 401
        right = httpx.put(f"{url}/v1/policy", json=body, headers={"Authorization": "Bearer #secret"}, timeout=10)
        assert right.status_code == 200, right.text
    finally:
        assert proc.stop() == 0


def assert_refused_in_one_line(result: subprocess.CompletedProcess, command: str, *needles: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gatherwise {command}: "), result.stderr
    assert all(needle in lines[0] for needle in needles), result.stderr


@pytest.mark.parametrize("table", ["missing", "/dev/zero", "fifo", "unknown-mode", "not-a-table"])
def test_a_bad_initial_table_file_refuses_the_config(table, tmp_path):
    """Not at install, where every rank of the engine (and of vLLM or SGLang, at their first hooked forward)
    would stop with a traceback: when the config is loaded, in one line."""
    path = {"missing": str(tmp_path / "missing.yaml"), "/dev/zero": "/dev/zero",
            "fifo": str(tmp_path / "fifo"), "unknown-mode": str(tmp_path / "modes.yaml"),
            "not-a-table": str(tmp_path / "list.yaml")}[table]
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "modes.yaml").write_text('table: {"1": gather, "8": fastest}\n')
    (tmp_path / "list.yaml").write_text("- gather\n")
    config = tmp_path / "engine.yaml"
    config.write_text(f"engine:\n  initial_table_file: {path}\n")
    shm = str(tmp_path / "shm")
    engine = ["engine", "--tp", "2", "--duration", "5", "--shm-dir", shm]
    assert_refused_in_one_line(run([*engine, "--config", str(config)]), "engine",
                               f"{config}: engine.initial_table_file: ")
    by_env = run(engine, GATHERWISE_ENGINE_INITIAL_TABLE_FILE=path)
    assert_refused_in_one_line(by_env, "engine", "GATHERWISE_ENGINE_INITIAL_TABLE_FILE: engine.initial_table_file: ")
    assert not os.path.exists(shm)


@pytest.mark.parametrize("command", ["sidecar", "engine"])
def test_an_integer_beyond_pythons_digit_limit_is_one_line(command, tmp_path):
    args = [command, *(["--port", "0"] if command == "sidecar" else ["--tp", "1", "--duration", "1"]),
            "--shm-dir", str(tmp_path / "shm")]
    huge = "9" * 5000
    config = tmp_path / "huge.yaml"
    config.write_text(f"policy:\n  window: {huge}\n")
    assert_refused_in_one_line(run([*args, "--config", str(config)]), command, str(config), "more than 4300 digits")
    assert_refused_in_one_line(run(args, GATHERWISE_POLICY_WINDOW=huge), command,
                               "GATHERWISE_POLICY_WINDOW", "more than 4300 digits")
    table = tmp_path / "table.yaml"
    table.write_text(f'tp: {huge}\ntable: {{"1": gather}}\n')
    assert_refused_in_one_line(run(args, GATHERWISE_ENGINE_INITIAL_TABLE_FILE=str(table)), command,
                               "more than 4300 digits")


@pytest.mark.parametrize("endpoint", ["http://[::1", "not a url", "ftp://collector/v1/traces", "http://:4318",
                                      "http://collector:99999"])
def test_an_otlp_endpoint_that_is_no_http_url_refuses_the_config(endpoint, tmp_path):
    """Refused when the sidecar starts, not logged as an error by every export batch from then on."""
    shm = ["--shm-dir", str(tmp_path / "shm")]
    by_env = run(["sidecar", "--port", "0", *shm], GATHERWISE_TRACES_OTLP_ENDPOINT=endpoint)
    assert_refused_in_one_line(by_env, "sidecar", "GATHERWISE_TRACES_OTLP_ENDPOINT: traces.otlp_endpoint: ")
    config = tmp_path / "traces.yaml"
    config.write_text(f"traces:\n  otlp_endpoint: '{endpoint}'\n")
    assert_refused_in_one_line(run(["sidecar", "--port", "0", "--config", str(config), *shm]), "sidecar",
                               f"{config}: traces.otlp_endpoint: ")
