"""The auto policy charges a mode with its step, not only its logits path (policy.cost).

A real TP=2 gloo engine where gather has the shortest logits path (5 ms injected into every all_gather, which
sharded's exchange uses too) but every gather call is followed by 30 ms more of the engine's step, outside the
path (tests._control_engine `rest_of_step`: what, on a CPU host, a rank's spinning OpenMP workers did to SGLang's
steps in sharded mode). Charged by the step (the default), auto leaves gather although its path is the
shortest; charged by the path (PUT /v1/policy {"cost": "path"}), it comes back to gather. Tokens and every
rank's mode per call stay identical throughout. Real uvicorn sidecar."""

from __future__ import annotations

import httpx
import pytest
import yaml

from tests._control_engine import BackgroundEngine, LoopSpec
from tests._sidecar import scrape, start_sidecar, total, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
PATH_SUM = "gatherwise_step_critical_path_seconds_sum"
PATH_COUNT = "gatherwise_step_critical_path_seconds_count"
TOKEN = "step-cost-token"


def test_auto_charges_the_step_and_path_cost_charges_the_path_alone(tmp_path, shm_dir):
    config = tmp_path / "gatherwise.yaml"
    config.write_text(yaml.safe_dump({
        "engine": {"shm_dir": shm_dir, "initial_mode": "gather"},
        "telemetry": {"ring_capacity": 4096},
        "control": {"inject_delay": [{"after_seconds": 0, "mode": "all_gather", "seconds": 0.005}]},
        "sidecar": {"poll_interval_seconds": 0.01},
        "traces": {"enabled": False},
        "policy": {"mode": "auto", "margin": 0.1, "min_samples": 6, "window": 32, "dwell_seconds": 1.0,
                   "probe_interval_seconds": 0.5, "probe_calls": 8, "probe_budget": 0.25,
                   "max_sample_age_seconds": 5.0}}))
    sidecar, url = start_sidecar(shm_dir, config=str(config), env_extra={"GATHERWISE_API_TOKEN": TOKEN})
    engine = BackgroundEngine(LoopSpec(str(config), str(tmp_path / "stop"), rows_cycle=(1, 8), pace_seconds=0.001,
                                       rest_of_step=(("gather", 0.03),)))
    client = httpx.Client(base_url=url, timeout=30)

    def active(bucket: str) -> str:
        return client.get("/v1/policy/table").json()["table"][bucket]

    try:
        wait_for(lambda: client.get("/v1/mode").status_code == 200, 90, "the sidecar to attach the engine")
        assert client.get("/v1/policy").json()["params"]["cost"] == "step"
        wait_for(lambda: active("1") != "gather" and active("8") != "gather", 60,
                 "auto (step cost) to leave gather, the mode with the shortest path and the longest step")
        by_step = [d for d in client.get("/v1/decisions", params={"limit": 256}).json()["decisions"]
                   if d["reason"] == "auto"]
        metrics = scrape(url)
        engine_label = client.get("/v1/stats").json()["engine"]
        path = {m: total(metrics, PATH_SUM, engine=engine_label, mode=m)
                / total(metrics, PATH_COUNT, engine=engine_label, mode=m) for m in ("gather", by_step[0]["mode"])}
        assert path["gather"] < path[by_step[0]["mode"]], path  # the path alone would have kept gather
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert client.put("/v1/policy", json={"cost": "path"}, headers=auth).status_code == 200
        wait_for(lambda: active("1") == "gather" and active("8") == "gather", 90,
                 "auto (path cost) to come back to gather")
        assert client.get("/v1/policy").json()["params"]["cost"] == "path"
    finally:
        results = engine.stop()
        sidecar.stop()
    estimates = by_step[0]["evidence"]["estimates"]
    assert estimates[by_step[0]["mode"]]["p50"] < estimates["gather"]["p50"]  # what the step charged
    assert estimates["gather"]["p50"] > 0.03  # gather's step holds the 30 ms outside its path
    assert results[0].modes == results[1].modes and results[0].tokens == results[1].tokens
