"""A real `gatherwise sidecar` next to the engine (127.0.0.1, a free port, reading the engine's shm_dir) and the
calls the benchmark makes to it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gatherwise.bench.bench_sidecar import auth_header, start_sidecar
from gatherwise.dashboards.child_process import stop_child

ATTACH_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


class SidecarLink:
    def __init__(self, shm_dir: str, config_path: Path) -> None:
        config_path.write_text(yaml.safe_dump({"engine": {"shm_dir": shm_dir},
                                               "sidecar": {"host": "127.0.0.1", "port": 0}}))
        self.proc, self.url = start_sidecar(str(config_path))
        self.http = httpx.Client(base_url=self.url, timeout=30, headers=auth_header())

    def wait_attached(self, timeout_s: float = ATTACH_TIMEOUT_S) -> dict[str, Any]:
        """GET /v1/engine until an engine is attached and up (its hooks exist after its first logits call)."""
        deadline = time.monotonic() + timeout_s
        while True:
            engine = self.http.get("/v1/engine").json()
            if engine.get("attached") and engine.get("up"):
                return engine
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sidecar did not attach to the engine within {timeout_s:.0f} s: {engine}")
            time.sleep(0.2)

    def put_mode(self, body: dict[str, Any]) -> dict[str, Any]:
        # wait=0: the engine applies a command at its next logits call, and an idle engine makes none
        reply = self.http.put("/v1/mode", params={"wait": 0}, json=body)
        if reply.status_code not in (200, 202):
            raise RuntimeError(f"PUT /v1/mode {body} -> {reply.status_code}: {reply.text}")
        return reply.json()

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        return self.http.get(path, params=params).json()

    def metrics_text(self) -> str:
        return self.http.get("/metrics").text

    def stop(self) -> None:
        self.http.close()
        stop_child(self.proc, STOP_TIMEOUT_S)
