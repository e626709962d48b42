"""The HTTP API against oversized bodies, loosely typed input and requests that need an engine when none runs.

One rule for engines (docs/api.md): an endpoint that acts on the engine's control block answers 409 when it has
none to act on — PUT /v1/mode (a command needs a running engine), GET /v1/mode and GET /v1/policy/table (an
attached engine's block). Reports of the sidecar's own state (/v1/engine, /v1/stats, /v1/decisions, /v1/policy)
answer 200 and say `null` where there is no engine.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import httpx
import pytest

from tests._processes import vm_kib
from tests._sidecar import wait_for
from tests.faults._faults import assert_sidecar_serves, running_engine, sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
BIG = 100 * 1024 * 1024


@pytest.fixture
def idle_sidecar(shm_dir):
    proc, _url, api = sidecar_with_token(shm_dir)
    yield proc, api
    assert proc.stop() == 0, "".join(proc.output)


def test_oversized_bodies_are_refused_before_they_are_read(idle_sidecar):
    proc, api = idle_sidecar
    before = vm_kib(proc.popen.pid, "VmRSS")
    declared = api.put("/v1/mode", content=b"x" * BIG, headers={"Content-Type": "application/json"})
    assert declared.status_code == 413 and "limit" in declared.json()["detail"]

    def chunks():
        block = b" " * (1 << 20)
        for _ in range(BIG // len(block)):
            yield block

    try:  # no Content-Length: cut off once past the limit (the server may close before the client is done)
        chunked = api.put("/v1/policy", content=chunks(), headers={"Content-Type": "application/json"})
        assert chunked.status_code == 413
    except httpx.HTTPError:
        pass
    assert vm_kib(proc.popen.pid, "VmRSS") - before < 32 * 1024  # never buffered: far below 100 MiB
    assert_sidecar_serves(proc, api)


def raw_put(api: httpx.Client, extra_headers: bytes, body_part: bytes) -> bytes:
    """PUT /v1/mode declaring a BIG body, send `body_part` of it, then read until the sidecar closes."""
    url = urlsplit(str(api.base_url))
    assert url.port is not None
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(b"PUT /v1/mode HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer fault-token\r\n" + extra_headers +
                     b"Content-Length: %d\r\n\r\n" % BIG + body_part)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def test_a_client_waiting_for_100_continue_is_refused_without_sending_the_body(idle_sidecar):
    proc, api = idle_sidecar
    answer = raw_put(api, b"Expect: 100-continue\r\n", b"")  # answered and closed: no 100 Continue
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in answer, answer
    assert b"limit" in body
    assert_sidecar_serves(proc, api)


def test_a_client_that_stalls_mid_body_gets_the_whole_413_and_is_let_go(idle_sidecar):
    proc, api = idle_sidecar
    answer = raw_put(api, b"", b"x" * (1 << 20))  # then silence: the sidecar lingers, then closes
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ") and b"limit" in body, answer
    assert_sidecar_serves(proc, api)


@pytest.mark.parametrize("buckets", [[True], [8.0], ["8"], [1, False]])
def test_bucket_bounds_must_be_json_integers(idle_sidecar, buckets):
    _, api = idle_sidecar
    response = api.put("/v1/mode", json={"mode": "gather", "buckets": buckets})
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("body", [{"min_samples": True}, {"window": 64.0}, {"margin": True}, {"margin": "0.1"}])
def test_policy_parameters_are_strictly_typed(idle_sidecar, body):
    _, api = idle_sidecar
    assert api.put("/v1/policy", json=body).status_code == 422


def test_no_engine_one_rule(idle_sidecar):
    _, api = idle_sidecar
    put = api.put("/v1/mode", json={"mode": "gather"})
    assert put.status_code == 409 and "no engine" in put.json()["detail"]
    assert api.get("/v1/mode").status_code == 409
    assert api.get("/v1/policy/table").status_code == 409
    assert api.get("/v1/stats").json()["engine"] is None
    assert api.get("/v1/decisions").json() == {"engine": None, "decisions": []}
    assert api.get("/v1/policy").json()["policy"] is None
    assert api.get("/v1/engine").json()["attached"] is False
    assert api.put("/v1/policy", json={"margin": 0.2}).status_code == 200  # the sidecar's own parameter
    assert api.get("/v1/decisions").json()["decisions"] == []  # the refused PUT logged nothing


def test_command_to_a_stopped_engine_is_409_and_logs_nothing(shm_dir):
    engine, _engine_id = running_engine(shm_dir, duration=600)
    proc, _url, api = sidecar_with_token(shm_dir)
    try:
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached")
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather"}).status_code == 200
        decisions = len(api.get("/v1/decisions").json()["decisions"])
        assert engine.stop() == 0
        wait_for(lambda: api.get("/v1/engine").json()["up"] is False, 60, "the engine reported down")
        refused = api.put("/v1/mode", params={"wait": 5}, json={"mode": "all_gather"})
        assert refused.status_code == 409 and "not running" in refused.json()["detail"], refused.text
        assert len(api.get("/v1/decisions").json()["decisions"]) == decisions
        assert api.get("/v1/mode").status_code == 200  # the stopped engine's last state is still readable
        assert proc.stop() == 0
    finally:
        if engine.popen.poll() is None:
            engine.popen.kill()
        if proc.popen.poll() is None:
            proc.popen.kill()
