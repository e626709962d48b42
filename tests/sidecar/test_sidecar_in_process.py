"""The sidecar's middle, in process: the composition root (build_state), the schedule, the control sessions, the
publisher and the control API, and the FastAPI app through TestClient, over a SidecarState built on a private
shared-memory directory holding a stand-in engine (liveness lock, ring and control block written by the engine
side's own code; its rank 0 applies a command only when the test says so). The real-uvicorn tests stay beside
these: what they add is the process, the socket and the signals."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gatherwise.config import GatherwiseConfig
from gatherwise.modes import NUM_BUCKETS, Mode, ModeTable
from gatherwise.sidecar.api.app import create_app
from gatherwise.sidecar.control.control_api import NotAttached
from gatherwise.sidecar.state import SidecarState, build_state
from lab.standins.engine import StandinEngine

TOKEN = "in-process-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GATHER = ModeTable.uniform(Mode.GATHER)


def config_for(shm_dir: str, **policy: object) -> GatherwiseConfig:
    return GatherwiseConfig.model_validate({
        "engine": {"shm_dir": shm_dir}, "sidecar": {"api_token": TOKEN}, "traces": {"enabled": False},
        "policy": {"mode": "auto", "probe_budget": 0.0, **policy}})


@pytest.fixture
def state(shm_dir: str, engine: StandinEngine) -> SidecarState:
    """Built, not started: the tests below drive its schedule by hand, one step at a time."""
    return build_state(config_for(shm_dir), env={})


@pytest.fixture
def client(state: SidecarState) -> Iterator[TestClient]:
    """The app over `state`, its lifespan running (the sidecar's loop thread started, and stopped after)."""
    with TestClient(create_app(state)) as test_client:
        test_client.headers.update(AUTH)
        yield test_client


def attach(state: SidecarState) -> None:
    """One step of the schedule (on this thread: the loop is not started): ingest finds the engine, a control
    session opens on its block."""
    state.schedule._step()
    assert state.ingest.engine is not None and state.control.sessions.current is not None


def test_build_state_wires_every_part_once(state: SidecarState) -> None:
    assert state.schedule.ingest is state.ingest
    assert state.control.sessions is state.schedule.sessions and state.control.loop is state.loop
    assert state.control.publisher is state.schedule.publisher and state.control.store is state.schedule.store
    assert state.control.api_token == TOKEN
    body, _ = state.metrics.exposition(None)
    assert b"gatherwise_mode_switches" in body


def test_a_schedule_step_attaches_the_engine_and_its_control_block(state: SidecarState,
                                                                   engine: StandinEngine) -> None:
    assert state.control.sessions.current is None
    attach(state)
    session = state.control.sessions.current
    assert session is not None and session.engine.engine_id == engine.engine_id and not session.read_only
    assert state.ingest.info().attached and state.ingest.info().engine_id == session.engine.label


def test_the_control_api_pins_publishes_and_sees_it_applied(state: SidecarState, engine: StandinEngine) -> None:
    """The loop is not running: each call runs inline, as on the loop thread."""
    control = state.control
    attach(state)
    seq, decision = asyncio.run(control.set_mode("gather", None))
    assert decision.reason == "manual" and decision.command_seq == seq
    view, snap = asyncio.run(control.snapshot())
    assert view.policy == "manual" and snap.command.seq == seq and snap.requested_table == GATHER
    assert snap.pending and snap.active_table != GATHER  # written, not applied yet
    assert engine.apply() == seq
    view, snap = asyncio.run(control.wait_applied(seq, 0.0))
    assert snap.status.applied_seq == seq and snap.active_table == GATHER and not snap.pending
    engine_label, decisions = asyncio.run(control.decisions(10))
    assert engine_label == view.engine and [d.id for d in decisions] == [decision.id]
    table, meta = asyncio.run(control.learned_table())
    assert table == GATHER and meta["tp"] == 1 and meta["policy"] == "manual"


def test_the_publisher_writes_only_what_the_policy_wants(state: SidecarState) -> None:
    attach(state)
    session = state.control.sessions.current
    assert session is not None
    publisher = state.schedule.publisher
    assert publisher.sync(session) is None  # the table the session opened with is written already
    before = session.client.snapshot().command.seq
    publisher.publish(session, [])  # no decision: nothing to write
    assert session.client.snapshot().command.seq == before
    decision = session.policy.pin(Mode.GATHER, [0], 0.0)
    publisher.publish(session, [decision])
    snap = session.client.snapshot()
    assert snap.command.seq != before and decision.command_seq == snap.command.seq
    assert snap.requested_table.modes[0] == Mode.GATHER and session.requested == snap.requested_table


def test_a_session_survives_a_restart_of_the_sidecar(shm_dir: str, engine: StandinEngine) -> None:
    """The store saves what a request decided; a new state on the same directory recovers it."""
    first = build_state(config_for(shm_dir), env={})
    attach(first)
    asyncio.run(first.control.set_mode("gather", [1, 2]))  # bucket indices: upper bounds 2 and 4
    first.schedule.stop()
    first.control.sessions.follow(None)  # the session ends: its control lock is free for the next sidecar
    second = build_state(config_for(shm_dir), env={})
    attach(second)
    view = asyncio.run(second.control.policy_view())
    assert view.pinned == {"2": "gather", "4": "gather"} and view.policy == "mixed" and not view.read_only
    second.schedule.stop()
    second.control.sessions.follow(None)


def test_without_an_engine_the_control_api_says_so(shm_dir: str) -> None:
    state = build_state(config_for(shm_dir), env={})
    state.schedule._step()
    with pytest.raises(NotAttached):
        asyncio.run(state.control.snapshot())
    stats = asyncio.run(state.control.stats())
    assert stats.engine is None and stats.stats == [] and state.control.control_view() is None


# -- the app, through TestClient ----------------------------------------------------------------------------------
def wait_attached(client: TestClient) -> None:
    for _ in range(600):
        if client.get("/v1/mode").status_code == 200:
            return
        asyncio.run(asyncio.sleep(0.01))
    raise AssertionError("the sidecar never attached the stand-in engine")


def test_the_app_serves_health_metrics_and_the_engine(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    wait_attached(client)
    assert client.get("/readyz").json()["ready"] is True
    assert client.get("/v1/engine").json()["attached"] is True
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "gatherwise_active_mode" in metrics.text


def test_the_app_pins_and_answers_202_until_rank_0_applies(client: TestClient, engine: StandinEngine) -> None:
    wait_attached(client)
    waited = client.put("/v1/mode", params={"wait": 0.05}, json={"mode": "gather", "buckets": [4]})
    assert waited.status_code == 202 and waited.json()["applied"] is False
    seq = waited.json()["seq"]
    assert engine.apply() == seq
    mode = client.get("/v1/mode").json()
    assert mode["applied_seq"] == seq and mode["active"]["4"] == "gather" and mode["pinned"] == {"4": "gather"}
    again = client.put("/v1/mode", params={"wait": 0}, json={"mode": "auto"})
    assert again.status_code == 202 and again.json()["state"]["pinned"] == {}


def test_the_app_refuses_mutations_without_the_token(client: TestClient) -> None:
    wait_attached(client)
    refused = client.put("/v1/mode", json={"mode": "gather"}, headers={"Authorization": "Bearer wrong"})
    assert refused.status_code == 401
    assert client.get("/v1/mode").json()["pinned"] == {}


def test_the_app_reports_stats_policy_and_decisions(client: TestClient) -> None:
    wait_attached(client)
    assert client.put("/v1/policy", json={"margin": 0.07}).json()["params"]["margin"] == 0.07
    assert client.get("/v1/policy").json()["params"]["margin"] == 0.07
    stats = client.get("/v1/stats").json()
    assert stats["calls_observed"] == 0 and stats["stats"] == []
    decisions = client.get("/v1/decisions", params={"limit": 5}).json()
    assert decisions["engine"] is not None and isinstance(decisions["decisions"], list)
    table = client.get("/v1/policy/table").json()
    assert len(table["table"]) == NUM_BUCKETS and table["tp"] == 1
