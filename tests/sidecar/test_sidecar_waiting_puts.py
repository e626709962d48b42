"""50 PUT /v1/mode?wait=600 waiting at once hold neither the sidecar's event loop nor its threads: /metrics and
/healthz still answer while they wait, and every one of them answers 200 (applied) once rank 0 applies the newest
command. A real uvicorn sidecar and a stand-in engine (lab.standins.engine)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from lab.standins.engine import StandinEngine
from tests._sidecar import wait_for
from tests.faults._faults import sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
WAITING = 50


def test_waiting_puts_block_nothing_and_complete_when_the_switch_lands(shm_dir):
    engine = StandinEngine(shm_dir)
    proc, url, api = sidecar_with_token(shm_dir)
    statuses: list[int] = []

    async def send() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=700, limits=httpx.Limits(max_connections=WAITING + 1),
                                     headers={"Authorization": "Bearer fault-token"}) as client:
            async def one(i: int) -> int:
                body = {"mode": ("gather", "all_gather")[i % 2], "buckets": [1 << (i % 16)]}
                return (await client.put("/v1/mode", params={"wait": 600}, json=body)).status_code
            statuses.extend(await asyncio.gather(*(one(i) for i in range(WAITING))))

    sender = threading.Thread(target=lambda: asyncio.run(send()), daemon=True)
    try:
        wait_for(lambda: api.get("/v1/mode").status_code == 200, 60, "the sidecar to attach the stand-in engine")
        before = api.get("/v1/mode").json()["requested_seq"]
        sender.start()
        wait_for(lambda: api.get("/v1/mode").json()["requested_seq"] >= before + WAITING, 60,
                 "every PUT to write its command")
        for _ in range(20):  # every PUT waits now
            assert api.get("/healthz").status_code == 200
            metrics = api.get("/metrics")
            assert metrics.status_code == 200 and "gatherwise_active_mode" in metrics.text
            assert api.get("/v1/engine").json()["attached"] is True
        assert sender.is_alive() and statuses == []  # none answered: rank 0 applied nothing yet
        applied = engine.apply()
        sender.join(120)
        assert not sender.is_alive() and statuses == [200] * WAITING
        assert api.get("/v1/mode").json()["applied_seq"] == applied
    finally:
        engine.apply()  # a failure above must not leave the sender waiting
        if sender.is_alive():
            sender.join(120)
        assert proc.stop() == 0, "".join(proc.output)
        engine.close()
