"""Helpers of the fault-injection suite: a real engine and sidecar, and what a test checks between faults."""

from __future__ import annotations

import json
import os
import time

import httpx

from gatherwise.shm_format.control import SIDECAR_STATE_NAME
from gatherwise.shm_format.ring import engine_dir, ring_path
from gatherwise.sidecar.ingest.ring_reader import RingReader
from gatherwise.sidecar.metrics.header_counters import total_calls
from tests._sidecar import Proc, spawn, start_engine, start_sidecar, wait_for

NOBODY = 65534  # uid and gid of "another local user" in the tests that need one (they run as root)
ENGINE_LINE = r"gatherwise engine ([0-9a-f]{16}): tp=(\d+)"


def running_engine(shm: str, *, tp: int = 2, duration: float = 600, workload: str = "fixed:2") -> tuple[Proc, int]:
    """`gatherwise engine` in `shm`, once its rings exist: (process, engine id)."""
    engine = start_engine(shm, tp=tp, duration=duration, workload=workload)
    engine_id = int(engine.wait_line(ENGINE_LINE, 180).group(1), 16)
    wait_for(lambda: all(os.path.exists(ring_path(shm, engine_id, r)) for r in range(tp)), 60, "the rings")
    return engine, engine_id


def ring_calls(shm: str, engine_id: int, rank: int = 0) -> int:
    with RingReader(ring_path(shm, engine_id, rank)) as reader:
        return total_calls(reader.header())


def assert_engine_progresses(engine: Proc, shm: str, engine_id: int, calls: int = 50) -> None:
    """The engine is alive and completes `calls` more logits calls (progress, not a rate: no timing asserts)."""
    start = ring_calls(shm, engine_id)
    wait_for(lambda: ring_calls(shm, engine_id) >= start + calls, 120, f"{calls} more engine calls")
    assert engine.popen.poll() is None, "".join(engine.output)


def no_server_error(response: httpx.Response) -> None:
    """httpx response hook of every fault test's client: whatever the fault, the sidecar never answers 5xx (but
    the 503 of /readyz, which is how it says "not ready")."""
    if response.status_code >= 500 and not (response.status_code == 503 and response.request.url.path == "/readyz"):
        response.read()
        raise AssertionError(f"{response.request.method} {response.request.url}: {response.status_code} "
                             f"{response.text[:500]}")


def sidecar_with_token(shm: str, token: str = "fault-token", *, config: str | None = None,
                       **env: str) -> tuple[Proc, str, httpx.Client]:
    proc, url = start_sidecar(shm, config=config, env_extra={"GATHERWISE_API_TOKEN": token, **env})
    # A fresh connection per request: the sidecar closes a connection that sends no request headers within
    # sidecar.header_timeout_seconds (some tests set 0.5 s), an idle keep-alive one included, and a pooled
    # connection reused at that moment fails with "Server disconnected", a race of the client's, not the sidecar's.
    api = httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {token}"},
                       event_hooks={"response": [no_server_error]}, limits=httpx.Limits(max_keepalive_connections=0))
    # "listening" is printed once the socket is bound; uvicorn accepts connections a moment later
    try:
        wait_for(lambda: api.get("/healthz").status_code == 200, 60, "the sidecar to serve")
    except BaseException:  # the caller never gets the process to stop: stop it here
        api.close()
        proc.stop()
        raise
    return proc, url, api


def assert_sidecar_serves(proc: Proc, api: httpx.Client) -> dict:
    """The sidecar process is alive and answers health, metrics and the engine view; returns /v1/engine."""
    assert proc.popen.poll() is None, "".join(proc.output)
    assert api.get("/healthz").status_code == 200
    assert api.get("/metrics").status_code == 200
    engine = api.get("/v1/engine")
    assert engine.status_code == 200
    return engine.json()


def wait_gone(path: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(path), f"{path} still exists: {os.listdir(path) if os.path.isdir(path) else ''}"


def engine_refuses(shm: str) -> str:
    """`gatherwise engine` refuses `shm` as its shm_dir: exit status 2 and one line, no traceback."""
    proc = spawn(["engine", "--tp", "1", "--duration", "5", "--shm-dir", shm])
    assert proc.popen.wait(180) == 2, "".join(proc.output)
    output = "".join(proc.output)
    assert "Traceback" not in output and output.startswith("gatherwise engine: engine.shm_dir: "), output
    return output


def state_saved_after_a_switch(shm_dir: str) -> tuple[Proc, str, dict]:
    """A running engine, the path of the sidecar-state.json a first sidecar saved when it stopped after one manual
    switch (bucket 2 to gather), and that state as saved. The engine is the caller's to stop."""
    engine, engine_id = running_engine(shm_dir)
    state_path = os.path.join(engine_dir(shm_dir, engine_id), SIDECAR_STATE_NAME)
    try:
        first, _url, api = sidecar_with_token(shm_dir)
        try:
            wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the first sidecar attached")
            assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather", "buckets": [2]}).status_code == 200
            assert first.stop() == 0, "".join(first.output)
        finally:
            api.close()
            if first.popen.poll() is None:
                first.popen.kill()
        with open(state_path) as f:
            return engine, state_path, json.load(f)
    except BaseException:
        engine.stop()
        raise


def write_state(path: str, text: str) -> None:
    """Replace a sidecar-state.json as a process of the engine's user could: 0600, temporary name then rename."""
    tmp = path + ".test"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)
