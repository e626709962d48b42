"""Auto policy end to end: a delay injected into gather makes the policy leave it, per bucket, and come back
when the delay moves to all_gather; probes stay within budget. Real TP=2 gloo engine + real uvicorn sidecar.

The delay sits in the communicator's all_gather and gather, and sharded exchanges its candidates by all_gather:
in phase 1 all_gather and sharded are both undelayed and within noise of each other (either may win, and which
one does depends on the machine), in phase 2 both are delayed and gather is the one fast mode."""

from __future__ import annotations

import httpx
import pytest
import yaml

from tests._control_engine import BackgroundEngine, LoopSpec
from tests._sidecar import scrape, start_sidecar, total, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(500)]
PHASE_2_AT = 45.0  # seconds after engine start: the delay moves from gather to all_gather
BUDGET = 0.25
PROBE_CALLS = 8


def test_auto_follows_the_injected_delay(tmp_path, shm_dir):
    config = tmp_path / "gatherwise.yaml"
    config.write_text(yaml.safe_dump({
        "engine": {"shm_dir": shm_dir, "initial_mode": "gather"},
        "telemetry": {"ring_capacity": 4096},
        "control": {"inject_delay": [{"after_seconds": 0, "mode": "gather", "seconds": 0.02},
                                     {"after_seconds": PHASE_2_AT, "mode": "all_gather", "seconds": 0.02}]},
        "sidecar": {"poll_interval_seconds": 0.01},
        "traces": {"enabled": False},
        "policy": {"mode": "auto", "margin": 0.1, "min_samples": 6, "window": 32, "dwell_seconds": 1.0,
                   "probe_interval_seconds": 0.5, "probe_calls": PROBE_CALLS, "probe_budget": BUDGET,
                   "max_sample_age_seconds": 10.0}}))
    sidecar, url = start_sidecar(shm_dir, config=str(config))
    engine = BackgroundEngine(LoopSpec(str(config), str(tmp_path / "stop"), rows_cycle=(1, 8), pace_seconds=0.001))
    client = httpx.Client(base_url=url, timeout=30)

    def active(bucket: str) -> str:
        """The policy's choice (GET /v1/policy/table): the active table also shows probes in flight."""
        return client.get("/v1/policy/table").json()["table"][bucket]

    try:
        wait_for(lambda: client.get("/v1/mode").status_code == 200, 90, "the sidecar to attach the engine")
        assert client.get("/v1/mode").json()["policy"] == "auto"
        wait_for(lambda: active("1") != "gather" and active("8") != "gather", PHASE_2_AT - 3,
                 "auto to leave the delayed gather mode")
        assert active("2") == "gather"  # a bucket without traffic is left alone
        # the decision log is bounded and probes fill it fast: keep phase 1's decisions now
        phase_1 = client.get("/v1/decisions", params={"limit": 256}).json()["decisions"]
        wait_for(lambda: active("1") == "gather" and active("8") == "gather", 120,
                 "auto to move back after the delay moved to all_gather")
        decisions = client.get("/v1/decisions", params={"limit": 256}).json()["decisions"]
        stats = client.get("/v1/stats").json()
        metrics = scrape(url)
    finally:
        results = engine.stop()
        sidecar.stop()
    seen = {d["id"]: d for d in phase_1 + decisions}
    auto = [seen[i] for i in sorted(seen) if seen[i]["reason"] == "auto"]
    for bucket in ("1", "8"):
        moves = [d["mode"] for d in auto if d["buckets"] == [bucket]]
        assert moves[0] != "gather" and moves[-1] == "gather", moves  # left the delayed mode, came back to it
    left = auto[0]["evidence"]["estimates"][auto[0]["mode"]]
    assert left["p50"] < auto[0]["evidence"]["estimates"]["gather"]["p50"] and left["samples"] >= 6
    assert [d for d in decisions if d["reason"] == "probe"]
    assert stats["probe_share"] <= BUDGET + 0.05, stats
    assert {s["bucket"] for s in stats["stats"]} == {"1", "8"}
    engine_label = stats["engine"]
    assert total(metrics, "gatherwise_mode_switches_total", engine=engine_label, reason="auto") >= 4
    assert total(metrics, "gatherwise_active_mode", engine=engine_label, bucket="2", mode="gather") == 1
    assert total(metrics, "gatherwise_policy_estimate_seconds", engine=engine_label, bucket="8") > 0
    assert results[0].modes == results[1].modes and results[0].tokens == results[1].tokens
