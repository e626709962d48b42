"""Faults: sidecar SIGKILL + restart recovers; an engine restart is a new instance, nothing mixed in; an
overwritten control block leaves the engine running on its last table. Real TP=2 engines, real sidecars."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
import yaml

from gatherwise.modes import Mode
from gatherwise.shm_format.control import BLOCK_SIZE, control_path
from gatherwise.shm_format.ring import ring_path
from gatherwise.sidecar.ingest.ring_reader import RingReader
from tests._control_engine import BackgroundEngine, LoopSpec
from tests._sidecar import scrape, start_sidecar, total, wait_for

TOKEN = "faults-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENV = {"GATHERWISE_API_TOKEN": TOKEN}
pytestmark = [pytest.mark.slow, pytest.mark.timeout(500)]


def test_sidecar_kill_engine_restart_and_corrupt_block(tmp_path, shm_dir):
    config = tmp_path / "gatherwise.yaml"
    config.write_text(yaml.safe_dump({
        "engine": {"shm_dir": shm_dir}, "telemetry": {"ring_capacity": 2048},
        "sidecar": {"poll_interval_seconds": 0.01}, "traces": {"enabled": False},
        "policy": {"mode": "auto", "probe_budget": 0.0}}))
    sidecar, url = start_sidecar(shm_dir, config=str(config), env_extra=ENV)
    engine: BackgroundEngine | None = BackgroundEngine(LoopSpec(str(config), str(tmp_path / "stop1"),
                                                                pace_seconds=0.003))
    second = None
    try:
        get = lambda path, **kw: httpx.get(f"{url}{path}", timeout=30, **kw)
        wait_for(lambda: get("/v1/mode").status_code == 200, 90, "attach")
        r = httpx.put(f"{url}/v1/mode", json={"mode": "gather", "buckets": [1, 2]}, params={"wait": 30},
                      headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        assert httpx.put(f"{url}/v1/policy", json={"margin": 0.25}, headers=AUTH).status_code == 200
        before = get("/v1/mode").json()
        decisions_before = [d["id"] for d in get("/v1/decisions").json()["decisions"]]
        switches_before = total(scrape(url), "gatherwise_mode_switches_total", reason="manual")
        assert before["pinned"] == {"1": "gather", "2": "gather"} and before["policy"] == "mixed"
        assert switches_before == 2

        # 1. SIGKILL the sidecar mid-run; the engine keeps going; a new sidecar recovers everything
        sidecar.stop(signal.SIGKILL)
        call_at_kill = before["call_index"]
        sidecar, url = start_sidecar(shm_dir, config=str(config), env_extra=ENV)
        wait_for(lambda: get("/v1/mode").status_code == 200, 90, "re-attach after SIGKILL")
        after = get("/v1/mode").json()
        assert after["call_index"] > call_at_kill
        for key in ("engine", "active", "pinned", "policy", "epoch", "applied_seq", "apply_call"):
            assert after[key] == before[key], key
        assert get("/v1/policy").json()["params"]["margin"] == 0.25
        assert [d["id"] for d in get("/v1/decisions").json()["decisions"]][:len(decisions_before)] == \
            decisions_before
        assert total(scrape(url), "gatherwise_mode_switches_total", reason="manual") == switches_before
        r = httpx.put(f"{url}/v1/mode", json={"mode": "auto", "buckets": [2]}, params={"wait": 30}, headers=AUTH,
                      timeout=60)
        assert r.status_code == 200 and r.json()["seq"] > before["requested_seq"]
        assert r.json()["decision"] > max(decisions_before)

        # 2. engine restart under the running sidecar: a new instance id, fresh state, old series gone
        old_engine = before["engine"]
        assert engine is not None
        engine.stop()
        engine = None
        second = BackgroundEngine(LoopSpec(str(config), str(tmp_path / "stop2"), pace_seconds=0.003))
        wait_for(lambda: get("/v1/mode").json()["engine"] != old_engine, 90, "the new engine instance")
        fresh = get("/v1/mode").json()
        assert fresh["pinned"] == {} and fresh["policy"] == "auto"
        assert all(d["reason"] != "manual" for d in get("/v1/decisions").json()["decisions"])
        text = scrape(url)
        assert total(text, "gatherwise_active_mode", engine=old_engine) == 0
        assert total(text, "gatherwise_mode_switches_total", engine=old_engine) == 0
        assert total(text, "gatherwise_active_mode", engine=fresh["engine"]) == 16  # one mode per bucket

        # 3. overwrite the control block: the engine keeps its last good table and runs on
        r = httpx.put(f"{url}/v1/mode", json={"mode": "gather"}, params={"wait": 30}, headers=AUTH, timeout=60)
        assert r.status_code == 200
        last_apply = r.json()["apply_call"]
        engine_id = int(fresh["engine"], 16)
        ring = RingReader(ring_path(shm_dir, engine_id, 0))
        with open(control_path(shm_dir, engine_id), "r+b") as f:
            f.write(os.urandom(BLOCK_SIZE))
        calls_at_corruption = ring.header().write_index
        wait_for(lambda: ring.header().write_index > calls_at_corruption + 16, 120, "calls after the corruption")
        ring.close()
        wait_for(lambda: get("/v1/mode").status_code == 409, 30, "the sidecar to notice the overwritten block")
        assert httpx.put(f"{url}/v1/mode", json={"mode": "all_gather"}, headers=AUTH).status_code == 409
        assert get("/v1/stats").status_code == 200 and get("/readyz").status_code in (200, 503)
    finally:
        for e in (engine, second):
            if e is not None:
                results = e.stop()
        sidecar.stop()
    rank0, rank1 = results
    assert rank0.control_disabled is True  # rank 0 ignored the foreign block (one warning)
    assert rank0.modes == rank1.modes
    assert len(rank0.modes) > calls_at_corruption + 16
    assert all(m == Mode.GATHER for m in rank0.modes[last_apply:]), "the engine left its last good table"
