"""The gatherwise sidecar(s) next to the engine and the calls the benchmark makes to them: one started here
(127.0.0.1, a free port, reading the engine's shm_dir), or those already running on the nodes of a group across
nodes (node 0's is the controller; every node's exports its own ranks)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gatherwise.bench.bench_sidecar import auth_header, start_sidecar
from gatherwise.child_process import stop_child

ATTACH_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


class SidecarLink:
    """`urls[0]` is the controller (mode, decisions, stats); every URL's /metrics counts (one rank set each)."""

    def __init__(self, urls: list[str], proc: subprocess.Popen | None = None) -> None:
        self.proc = proc
        self.url = urls[0]
        self.clients = [httpx.Client(base_url=url, timeout=30, headers=auth_header()) for url in urls]
        self.http = self.clients[0]

    @classmethod
    def start(cls, shm_dir: str, config_path: Path) -> SidecarLink:
        """A sidecar of this checkout on 127.0.0.1, reading `shm_dir`; stop() ends it."""
        config_path.write_text(yaml.safe_dump({"engine": {"shm_dir": shm_dir},
                                               "sidecar": {"host": "127.0.0.1", "port": 0}}))
        proc, url = start_sidecar(str(config_path))
        return cls([url], proc)

    def wait_attached(self, timeout_s: float = ATTACH_TIMEOUT_S) -> dict[str, Any]:
        """GET /v1/engine on every sidecar until each has its engine attached and up (its hooks exist after its
        first logits call); the controller's answer, with the others' under "nodes" when there are several."""
        deadline = time.monotonic() + timeout_s
        while True:
            engines = [_engine(client) for client in self.clients]
            if all(e.get("attached") and e.get("up") for e in engines):
                return engines[0] if len(engines) == 1 else {**engines[0], "nodes_attached": engines}
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sidecar(s) did not attach to the engine within {timeout_s:.0f} s: {engines}")
            time.sleep(0.2)

    @property
    def pid(self) -> int | None:
        """The sidecar process started here (None: those already running on the nodes)."""
        return None if self.proc is None else self.proc.pid

    def put_mode(self, body: dict[str, Any]) -> dict[str, Any]:
        # wait=0: the engine applies a command at its next logits call, and an idle engine makes none
        reply = self.http.put("/v1/mode", params={"wait": 0}, json=body)
        if reply.status_code not in (200, 202):
            raise RuntimeError(f"PUT /v1/mode {body} -> {reply.status_code}: {reply.text}")
        return reply.json()

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        return self.http.get(path, params=params).json()

    def metrics_texts(self) -> list[str]:
        """Every sidecar's /metrics, the controller's first."""
        return [client.get("/metrics").text for client in self.clients]

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        if self.proc is not None:
            stop_child(self.proc, STOP_TIMEOUT_S)


def _engine(client: httpx.Client) -> dict[str, Any]:
    """GET /v1/engine; a node's sidecar starts beside its engine and may not listen yet."""
    try:
        return client.get("/v1/engine").json()
    except httpx.TransportError as exc:
        return {"attached": False, "error": str(exc)}
