"""Which runner and logits route each rank runs, and what its fingerprints matched, as the sidecar shows it: the
rank info file's route in GET /v1/engine and `gatherwise_engine_route_info`, and a rank info file with a route
key the reader does not know refused as a whole."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gatherwise.shm_format.engine_info import RankInfo, RankRoute, read_rank_info, write_rank_info
from gatherwise.sidecar.api.app import create_app
from gatherwise.sidecar.state import build_state
from lab.standins.engine import StandinEngine
from tests.sidecar.test_sidecar_in_process import AUTH, config_for

ROUTE = RankRoute("vllm.v1.worker.gpu.model_runner.GPUModelRunner",
                  "vLLM's Model Runner V2 (v1/worker/gpu/model_runner.py, and its CPU subclass)",
                  "vllm 0.34.0: 23 of 23 points match")


@pytest.fixture
def client(shm_dir: str) -> Iterator[TestClient]:
    engine = StandinEngine(shm_dir)
    write_rank_info(engine.dir, 0, "vLLM", "0.34.0", {}, "a-model", ROUTE)
    try:
        with TestClient(create_app(build_state(config_for(shm_dir), env={}))) as test_client:
            test_client.headers.update(AUTH)
            yield test_client
    finally:
        engine.close()


def test_the_engine_and_the_metric_name_each_ranks_route(client: TestClient) -> None:
    for _ in range(600):
        routes = client.get("/v1/engine").json()["routes"]
        if routes:
            break
        asyncio.run(asyncio.sleep(0.01))
    assert routes == [{"rank": 0, "kind": "vLLM", "route": {"runner": ROUTE.runner, "route": ROUTE.route,
                                                             "fingerprint": ROUTE.fingerprint}}]
    metrics = client.get("/metrics").text
    (line,) = [x for x in metrics.splitlines() if x.startswith("gatherwise_engine_route_info{")]
    assert 'rank="0"' in line and f'runner="{ROUTE.runner}"' in line and f'fingerprint="{ROUTE.fingerprint}"' in line
    assert line.endswith(" 1.0")


def test_a_file_without_a_route_reads_as_none_and_an_unknown_route_key_is_refused(tmp_path: Path) -> None:
    write_rank_info(tmp_path, 0, "gatherwise reference engine", "1.0", {})
    info = read_rank_info(tmp_path, 0)
    assert info is not None and info.route == RankRoute()
    old = json.loads(info.to_json())
    del old["route"]  # written before the key existed
    assert RankInfo.from_json(json.dumps(old).encode()).route == RankRoute()
    with pytest.raises(ValueError, match="route"):
        RankInfo.from_json(json.dumps({**old, "route": {"runner": "x", "planted": "y"}}).encode())
    with pytest.raises(ValueError, match="route"):
        RankInfo.from_json(json.dumps({**old, "route": {"runner": 1}}).encode())
