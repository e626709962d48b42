"""An engine that runs a sharded table (engine.initial_mode=sharded) is served by the sidecar's control API:
GET /v1/mode shows it, and PUT /v1/mode switches away from it. Real reference engine (TP=2, gloo) and a real
sidecar process on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._engine_harness import clean_env, http, start_sidecar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _mode(url: str, deadline_s: float = 120.0) -> dict:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            code, body = http("GET", f"{url}/v1/mode")
        except OSError:  # the server may print its address a moment before it accepts connections
            time.sleep(0.2)
            continue
        if code == 200:
            return json.loads(body)
        assert code == 409, (code, body)  # no engine attached yet; never a server error
        time.sleep(0.2)
    raise AssertionError("the sidecar did not attach to the engine")


def test_sharded_table_is_shown_and_switched(shm_dir):
    exe = Path(sys.executable).parent / "gatherwise"
    engine = subprocess.Popen([str(exe), "engine", "--tp", "2", "--workload", "fixed:2", "--duration", "120",
                               "--shm-dir", shm_dir], env=clean_env(GATHERWISE_ENGINE_INITIAL_MODE="sharded"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sidecar = start_sidecar(shm_dir)
    try:
        state = _mode(sidecar.url)
        assert set(state["active"].values()) == {"sharded"}
        code, body = http("PUT", f"{sidecar.url}/v1/mode?wait=30", {"mode": "all_gather"}, sidecar.token)
        assert code == 200, body
        assert set(json.loads(body)["state"]["active"].values()) == {"all_gather"}
    finally:
        sidecar.stop()
        engine.terminate()
        engine.wait(timeout=60)
