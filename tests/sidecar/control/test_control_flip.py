"""Flips by HTTP under load: a real TP=2 gloo engine, a real uvicorn sidecar, every rank switches at one call."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from gatherwise.modes import Mode, bucket_of
from tests._control_engine import BackgroundEngine, LoopSpec, reference_tokens, rows_for
from tests._sidecar import start_sidecar, wait_for

TOKEN = "flip-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def write_config(tmp_path: Path, shm_dir: str, **policy: object) -> str:
    cfg = {"engine": {"shm_dir": shm_dir, "initial_mode": "all_gather"},
           "telemetry": {"ring_capacity": 4096},
           "sidecar": {"poll_interval_seconds": 0.01},
           "traces": {"enabled": False},
           "policy": {"mode": "manual", **policy}}
    path = tmp_path / "gatherwise.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_flips_under_load_switch_every_rank_at_one_call_and_keep_tokens(tmp_path, shm_dir):
    config = write_config(tmp_path, shm_dir)
    sidecar, url = start_sidecar(shm_dir, config=config, env_extra={"GATHERWISE_API_TOKEN": TOKEN})
    spec = LoopSpec(config, str(tmp_path / "stop"))
    engine = BackgroundEngine(spec)
    try:
        client = httpx.Client(base_url=url, timeout=30)
        wait_for(lambda: client.get("/v1/mode").status_code == 200, 90, "the sidecar to attach the engine")
        # one flip with a wait: 200 and the call index where every rank switched
        r = client.put("/v1/mode", json={"mode": "gather"}, params={"wait": 20}, headers=AUTH)
        assert r.status_code == 200, r.text
        first = r.json()
        assert first["applied"] and set(first["state"]["active"].values()) == {"gather"}
        assert first["state"]["call_index"] >= first["apply_call"]  # "applied" once the call that runs it began
        # a per-bucket flip: only bucket 8 (rows 5..8) back to all_gather
        r = client.put("/v1/mode", json={"mode": "all_gather", "buckets": [8]}, params={"wait": 20}, headers=AUTH)
        assert r.status_code == 200, r.text
        second = r.json()
        assert second["state"]["active"]["8"] == "all_gather" and second["state"]["active"]["4"] == "gather"
        assert second["state"]["policy"] == "manual" and second["apply_call"] > first["apply_call"]
        wait_for(lambda: client.get("/v1/mode").json()["call_index"] > second["apply_call"] + 12, 60,
                 "calls after the per-bucket flip")
        # 200 flips as fast as the API accepts them (no wait), alternating tables
        seqs = []
        for i in range(200):
            body: dict[str, object] = {"mode": "gather" if i % 2 else "all_gather"}
            if i % 3 == 0:
                body["buckets"] = [1, 2, 4]
            r = client.put("/v1/mode", json=body, params={"wait": 0}, headers=AUTH)
            assert r.status_code in (200, 202), r.text
            seqs.append(r.json()["seq"])
        assert seqs == sorted(seqs) and len(set(seqs)) == 200
        r = client.put("/v1/mode", json={"mode": "gather"}, params={"wait": 30}, headers=AUTH)
        assert r.status_code == 200, r.text
        last = r.json()
        decisions = client.get("/v1/decisions", params={"limit": 256}).json()["decisions"]
        assert len([d for d in decisions if d["reason"] == "manual"]) >= 200
        wait_for(lambda: client.get("/v1/mode").json()["call_index"] > last["apply_call"] + 16, 60,
                 "calls after the last flip")
    finally:
        results = engine.stop()
        sidecar.stop()
    rank0, rank1 = results
    assert rank0.modes == rank1.modes, "ranks disagreed on a mode"
    assert rank0.tokens == rank1.tokens
    calls = len(rank0.modes)
    # the first flip: from first["apply_call"] on, every call ran gather (until the second flip)
    a1, a2 = first["apply_call"], second["apply_call"]
    assert all(rank0.modes[c] == Mode.GATHER for c in range(a1, a2))
    assert rank0.modes[a1 - 1] == Mode.ALL_GATHER
    for c in range(a2, min(a2 + 12, calls)):
        expected = Mode.ALL_GATHER if bucket_of(rows_for(spec, c)) == 3 else Mode.GATHER
        assert rank0.modes[c] == expected, f"call {c}"
    assert all(m == Mode.GATHER for m in rank0.modes[last["apply_call"]:])
    assert {Mode.GATHER, Mode.ALL_GATHER} <= set(rank0.modes)
    assert rank0.tokens == reference_tokens(spec, calls), "tokens depend on the switch schedule"
