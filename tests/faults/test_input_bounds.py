"""Hostile input at the edges: configuration that expands or never ends, JSON bodies that repeat a key,
connections that never send their headers, and what the engine listens on.

A config is a bounded regular file without YAML aliases (one short line and exit status 2 otherwise, at once),
a repeated JSON key is a 422 that changes nothing, a half-open connection is closed after the header timeout
while the sidecar keeps answering, and a local engine's rendezvous listens on loopback only.
"""

from __future__ import annotations

import os
import socket
import subprocess
from urllib.parse import urlsplit

import pytest

from gatherwise.shm_format.ring import ring_path
from gatherwise.sidecar.ingest.ring_reader import RingReader
from tests._sidecar import GATHERWISE, ROOT
from tests.faults._faults import assert_engine_progresses, assert_sidecar_serves, running_engine, sidecar_with_token
from tests.faults._host import listening_addresses

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))
COMMANDS = [["sidecar", "--port", "0"], ["engine", "--tp", "1", "--duration", "1"]]


def gatherwise(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GATHERWISE, *args], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


def assert_one_short_line(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and len(result.stderr) < 600, result.stderr[:2000]
    assert all(w in result.stderr for w in words), result.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=["sidecar", "engine"])
def test_config_files_that_expand_never_end_or_block_are_refused(command, tmp_path):
    shm = ["--shm-dir", str(tmp_path / "shm")]
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text(LAUGHS)
    assert_one_short_line(gatherwise([*command, "--config", str(laughs), *shm]), "aliases are not accepted")
    huge = tmp_path / "huge.yaml"
    huge.write_text("policy:\n  x: [" + "1, " * 200_000 + "1]\n")
    assert_one_short_line(gatherwise([*command, "--config", str(huge), *shm]), "larger than")
    assert_one_short_line(gatherwise([*command, "--config", "/dev/zero", *shm]), "not a regular file")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert_one_short_line(gatherwise([*command, "--config", str(fifo), *shm]), "not a regular file")
    laughs_inline = LAUGHS.replace("\n", ", ").rstrip(", ")
    assert_one_short_line(gatherwise([*command, *shm], GATHERWISE_SIDECAR_PORT="{" + laughs_inline + "}"),
                          "GATHERWISE_SIDECAR_PORT", "aliases are not accepted")
    assert not (tmp_path / "shm").exists()


def test_repeated_json_keys_half_open_connections_and_a_loopback_rendezvous(shm_dir):
    engine, engine_id = running_engine(shm_dir)
    sidecar, url, api = sidecar_with_token(shm_dir, GATHERWISE_SIDECAR_HEADER_TIMEOUT_SECONDS="0.5")
    try:
        # every TCP socket the engine's ranks listen on (rendezvous store, gloo) is bound to 127.0.0.1
        pids = []
        for rank in range(2):
            with RingReader(ring_path(shm_dir, engine_id, rank)) as reader:
                pids.append(reader.header().writer_pid)
        addresses = [a for pid in pids for a in listening_addresses(pid)]
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses

        # a repeated key is refused and changes nothing
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather"}).status_code == 200
        decisions = api.get("/v1/decisions").json()["decisions"]
        refused = api.put("/v1/mode", content=b'{"mode": "gather", "mode": "all_gather"}',
                          headers={"Content-Type": "application/json"})
        assert refused.status_code == 422 and "duplicate key 'mode'" in refused.text, refused.text
        assert api.put("/v1/policy", content=b'{"margin": 0.1, "margin": 9}',
                       headers={"Content-Type": "application/json"}).status_code == 422
        assert api.get("/v1/decisions").json()["decisions"] == decisions
        assert api.get("/v1/policy").json()["params"]["margin"] == 0.05
        assert api.get("/v1/mode").json()["active"]["1"] == "gather"

        # connections that send nothing, or half a request, are closed; the sidecar answers meanwhile
        address = urlsplit(url)
        for partial in (b"", b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"):
            assert address.port is not None
            with socket.create_connection((address.hostname, address.port), timeout=60) as sock:
                sock.sendall(partial)
                assert api.get("/healthz").status_code == 200
                assert sock.recv(4096) == b""  # closed by the sidecar, with nothing sent
        assert_engine_progresses(engine, shm_dir, engine_id)
        assert_sidecar_serves(sidecar, api)
        assert sidecar.stop() == 0, "".join(sidecar.output)
    finally:
        engine.stop()
        if sidecar.popen.poll() is None:
            sidecar.popen.kill()
