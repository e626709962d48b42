"""A TP group across two nodes, as each node's sidecar sees it: two shared-memory directories (two hosts' /dev/shm)
holding one engine instance's rings — ranks 0 and 1 with the control block on node 0, ranks 2 and 3 on node 1 —
written with the engine's own ring writer, liveness locks, control block and node file. Each sidecar reads its
node's ranks, joins a call when they all reported it, exports node-local cross-rank families, and traces the same
calls into the same traces; only node 0's sidecar controls (ingest directly, the app through TestClient, and the
real `gatherwise sidecar` process on node 1)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gatherwise.config import GatherwiseConfig
from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.control_block import ControlBlockSource
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format.control import control_path
from gatherwise.shm_format.liveness import LivenessLock
from gatherwise.shm_format.node_ranks import node_path, write_node_ranks
from gatherwise.shm_format.private_files import ensure_private_dir
from gatherwise.shm_format.ring import engine_dir, engine_dir_name, ring_path
from gatherwise.sidecar.api.app import create_app
from gatherwise.sidecar.state import build_state
from gatherwise.sidecar.traces.tracer import CallTracer, new_provider
from tests._sidecar import scrape, start_sidecar, total, wait_for
from tests.sidecar.ingest.test_sidecar_ingest import FakeClock, ingest_with_metrics, samples, value, write_call

ENGINE_ID = 0x2A2A
ENGINE = engine_dir_name(ENGINE_ID)
TP = 4
NODES = ((0, 1), (2, 3))
TOKEN = "multi-node-token"


class Node:
    """One node's share of the engine: its ranks' liveness locks and rings, rank 0's control block on node 0, and
    (once `complete()`) the node file install writes after every rank made its files."""

    def __init__(self, shm: Path, index: int, *, control: bool = True) -> None:
        self.shm, self.index, self.ranks = shm, index, NODES[index]
        self.dir = Path(ensure_private_dir(engine_dir(ensure_private_dir(shm), ENGINE_ID)))
        self.locks = [LivenessLock(self.dir, r) for r in self.ranks]
        self.block = (ControlBlockSource(control_path(shm, ENGINE_ID), engine_id=ENGINE_ID, tp_size=TP,
                                         table=ModeTable.uniform(Mode.ALL_GATHER))
                      if control and 0 in self.ranks else None)
        self.rings = {r: RingRecorder(ring_path(shm, ENGINE_ID, r), engine_id=ENGINE_ID, rank=r, tp_size=TP,
                                      vocab=1000, dtype="float32", capacity=64) for r in self.ranks}

    def complete(self) -> None:
        write_node_ranks(self.dir, TP, self.ranks, self.index, len(NODES))

    def close(self) -> None:
        for ring in self.rings.values():
            ring.close()
        if self.block is not None:
            self.block.close()
        for lock in self.locks:
            lock.close()


def write_calls(nodes: list[Node], calls: int, t0: int) -> None:
    """`calls` all_gather calls on every rank; rank 0 waits for the other node's shards: its path is 20 µs, the
    other ranks' 9 µs (each starts 1 µs after the rank before it, as write_call lays them out)."""
    for i in range(calls):
        start = t0 + i * 50_000
        for node in nodes:
            for rank, ring in node.rings.items():
                if rank == 0:
                    ring.record(CallMarks(i, Mode.ALL_GATHER, 3, 0, 4096, start, start + 100, start + 16100, 0, 0,
                                          start + 16100, start + 19100, start + 20000))
                else:
                    write_call(ring, i, Mode.ALL_GATHER, 3, start)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    with ExitStack() as stack:
        made = []
        for index in range(len(NODES)):
            node = Node(tmp_path / f"node{index}", index)
            stack.callback(node.close)
            made.append(node)
        yield made


def test_each_node_reads_its_ranks_and_joins_calls_when_they_reported(nodes: list[Node]) -> None:
    clock = FakeClock()
    for node in nodes:
        node.complete()
    write_calls(nodes, 5, clock.now - 10**6)
    views = [ingest_with_metrics(node.shm, clock=clock, join_timeout=1.0) for node in nodes]
    polls = [ingest.poll_once() for _, ingest in views]
    assert [p.records for p in polls] == [10, 10]
    for (metrics, ingest), node, poll in zip(views, nodes, polls, strict=True):
        info = ingest.info()
        assert (info.tp_size, info.ranks, info.node_index, info.nodes) == (TP, node.ranks, node.index, 2)
        assert (info.calls_joined, info.calls_incomplete, info.calls_pending) == (5, 0, 0)
        got = samples(metrics)
        tp_node = str(node.index)
        assert {dict(k[1]).get("rank") for k in got if k[0] == "gatherwise_calls_total"} == set(map(str, node.ranks))
        # node-local cross-rank figures: families of their own, with the node; none of the group-wide ones
        assert value(got, "gatherwise_node_step_critical_path_seconds_count", engine=ENGINE, tp_node=tp_node,
                     mode="all_gather", bucket="4") == 5
        assert value(got, "gatherwise_node_rank_skew_seconds_count", engine=ENGINE, tp_node=tp_node,
                     mode="all_gather") == 5
        assert not [k for k in got if k[0].startswith(("gatherwise_step_critical_path", "gatherwise_rank_skew"))]
        assert [c.call_index for c in poll.calls] == list(range(5))
    # the policy's input on node 0 is rank 0's path (it waited for node 1's shards), not the node-local path
    crit0 = value(samples(views[0][0]), "gatherwise_node_step_critical_path_seconds_sum", engine=ENGINE,
                  tp_node="0", mode="all_gather", bucket="4")
    assert abs(crit0 - 5 * 19_000e-9) < 1e-12  # rank 1 in last (+1 µs), rank 0 out last (+20 µs)
    assert [round(c.seconds * 1e9) for c in polls[0].calls] == [20_000] * 5
    assert [round(c.seconds * 1e9) for c in polls[1].calls] == [9_000] * 5  # node 1: its own critical path
    # the engine-wide top-p counters come from rank 0's header: node 1's sidecar leaves them out
    assert value(samples(views[0][0]), "gatherwise_topp_rows_total", engine=ENGINE) == 0
    assert not [k for k in samples(views[1][0]) if k[0] == "gatherwise_topp_rows_total"]


def test_a_directory_is_read_whole_or_once_its_node_file_says_which_ranks_it_holds(tmp_path: Path) -> None:
    """A single-node engine's directory half built (rank 0's ring only) is never read as a node holding rank 0;
    a node's directory without its node file is not read either, however many of its rings exist."""
    clock = FakeClock()
    single = Path(ensure_private_dir(tmp_path / "single"))
    directory = Path(ensure_private_dir(engine_dir(single, 0x51)))
    locks = [LivenessLock(directory, r) for r in (0, 1)]
    first = RingRecorder(ring_path(single, 0x51, 0), engine_id=0x51, rank=0, tp_size=2, vocab=1000,
                         dtype="float32", capacity=64)
    _, ingest = ingest_with_metrics(single, clock=clock, discover_interval=0.0)
    assert ingest.poll_once().engine is None
    second = RingRecorder(ring_path(single, 0x51, 1), engine_id=0x51, rank=1, tp_size=2, vocab=1000,
                          dtype="float32", capacity=64)
    poll = ingest.poll_once()  # every rank's ring, no node file: attached as always
    assert poll.engine is not None and poll.engine.ranks == (0, 1) and not poll.engine.partial
    first.close()
    second.close()
    for lock in locks:
        lock.close()

    for index in range(len(NODES)):
        node = Node(tmp_path / f"node{index}", index)
        try:
            _, ingest = ingest_with_metrics(node.shm, clock=clock, discover_interval=0.0)
            assert ingest.poll_once().engine is None  # its rings (and on node 0 the block) exist: not complete
            node.complete()
            eng = ingest.poll_once().engine
            assert eng is not None and eng.ranks == node.ranks and eng.partial and eng.tp_node == str(index)
        finally:
            node.close()


def test_a_node_file_that_disagrees_with_the_rings_is_not_read(tmp_path: Path) -> None:
    clock = FakeClock()
    node = Node(tmp_path / "node1", 1)
    try:
        write_node_ranks(node.dir, TP, (1, 2, 3), 1, 2)  # names a ring that is not here
        _, ingest = ingest_with_metrics(node.shm, clock=clock, discover_interval=0.0)
        assert ingest.poll_once().engine is None
        Path(node_path(node.dir)).write_bytes(b'{"format": 1, "tp_size": 4, "ranks": [2, 3]}')  # no node file
        assert ingest.poll_once().engine is None
        write_node_ranks(node.dir, 8, (2, 3), 1, 2)  # another TP size than the rings'
        assert ingest.poll_once().engine is None
        node.complete()
        assert ingest.poll_once().engine is not None
    finally:
        node.close()


def test_every_node_traces_the_same_calls_into_the_same_traces(nodes: list[Node]) -> None:
    """Node 0's sidecar emits the root span of each traced call; node 1's emits its ranks' spans under it. Trace
    ids agree, span ids never collide, and both trace exactly the calls the shared sampling picks."""
    clock = FakeClock()
    for node in nodes:
        node.complete()
    write_calls(nodes, 40, clock.now - 10**7)
    exported, exemplars = [], []
    for node in nodes:
        exporter = InMemorySpanExporter()
        tracer = CallTracer(new_provider("gw-test", SimpleSpanProcessor(exporter)), sample_ratio=0.3,
                            every_nth=16, offset_ns=0)
        metrics, ingest = ingest_with_metrics(node.shm, clock=clock, join_timeout=1.0)
        ingest.tracer = tracer
        ingest.poll_once()
        exported.append(exporter.get_finished_spans())
        body, _ = metrics.exposition("application/openmetrics-text; version=1.0.0")
        exemplars.append({line.split('trace_id="')[1][:32] for line in body.decode().splitlines()
                          if 'trace_id="' in line})
    roots = {s.context.trace_id: s for s in exported[0] if s.name == "logits.call"}
    traced = {s.attributes["gatherwise.call_index"] for s in roots.values() if s.attributes}
    assert {0, 16, 32} <= traced and len(traced) < 40  # every 16th, plus those the call index hashes in
    assert not [s for s in exported[1] if s.name == "logits.call"]
    for span in exported[1]:
        root = roots[span.context.trace_id]  # the same trace as node 0's
        assert span.parent is not None and span.parent.span_id == root.context.span_id and span.parent.is_remote
    assert {s.context.trace_id for s in exported[1]} == set(roots)  # the same calls traced on both nodes
    ids = [s.context.span_id for spans in exported for s in spans]
    assert len(ids) == len(set(ids))
    assert {r for spans in exported for s in spans if s.attributes and (r := s.attributes.get("tp.rank")) is not None} \
        == {0, 1, 2, 3}
    assert exemplars[1] and exemplars[1] <= {format(t, "032x") for t in roots}


def config_for(shm: Path) -> GatherwiseConfig:
    return GatherwiseConfig.model_validate({
        "engine": {"shm_dir": str(shm)}, "sidecar": {"api_token": TOKEN}, "traces": {"enabled": False},
        "policy": {"mode": "auto", "probe_budget": 0.0}})


def ready(client: TestClient) -> dict:
    """/readyz once the sidecar attached the node's engine (its records are fresh)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = client.get("/readyz")
        if found.status_code == 200:
            return found.json()
        time.sleep(0.05)
    raise AssertionError(f"the sidecar never became ready: {found.json()}")


def role_samples(client: TestClient) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.labels["role"]: s.value for fam in text_string_to_metric_families(client.get("/metrics").text)
            for s in fam.samples if s.name == "gatherwise_sidecar_role" and s.labels["engine"] == ENGINE}


def test_node_0_controls_and_node_1_observes(nodes: list[Node]) -> None:
    for node in nodes:
        node.complete()
    write_calls(nodes, 3, time.monotonic_ns() - 10**6)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    observing = build_state(config_for(nodes[1].shm), env={})
    with TestClient(create_app(build_state(config_for(nodes[0].shm), env={}))) as controller, \
            TestClient(create_app(observing)) as observer:
        assert ready(controller)["role"] == "controller" and ready(observer)["role"] == "observer"
        assert role_samples(controller) == {"controller": 1.0, "observer": 0.0}
        assert role_samples(observer) == {"controller": 0.0, "observer": 1.0}

        mode = controller.get("/v1/mode")
        assert mode.status_code == 200 and mode.json()["role"] == "controller" and not mode.json()["read_only"]
        refused = observer.get("/v1/mode")
        assert refused.status_code == 409 and refused.json()["role"] == "observer"
        assert "TP rank 0's node" in refused.json()["detail"] and "2, 3 of 4" in refused.json()["detail"]

        # every mutation of the observer: 409 with the reason, with a token or without one
        for headers in (auth, {}):
            for method, path, body in (("PUT", "/v1/mode?wait=0", {"mode": "gather"}),
                                       ("PUT", "/v1/policy", {"margin": 0.2})):
                answer = observer.request(method, path, json=body, headers=headers)
                assert answer.status_code == 409 and "observes engine" in answer.json()["detail"], answer.text
        assert observer.get("/v1/policy").json()["params"]["margin"] != 0.2  # nothing changed
        assert not [k for k in observer.get("/metrics").text.splitlines() if k.startswith("gatherwise_active_mode")]
        engine = observer.get("/v1/engine").json()
        assert (engine["ranks"], engine["node_index"], engine["nodes"]) == ([2, 3], 1, 2)
        # no policy runs there: no control session, no decisions, no saved state in its directory
        assert observing.loop.call(lambda: observing.control.sessions.current) is None
        assert observer.get("/v1/decisions").json() == {"engine": None, "decisions": []}
        assert not list(nodes[1].dir.glob("sidecar-state*"))

        # the controller takes the same mutation
        pinned = controller.put("/v1/mode?wait=0", json={"mode": "gather", "buckets": [4]}, headers=auth)
        assert pinned.status_code == 202 and pinned.json()["state"]["role"] == "controller"


@pytest.mark.timeout(180)
def test_the_sidecar_process_on_node_1_observes(nodes: list[Node]) -> None:
    for node in nodes:
        node.complete()
    write_calls(nodes, 3, time.monotonic_ns() - 10**6)
    proc, url = start_sidecar(str(nodes[1].shm), env_extra={"GATHERWISE_API_TOKEN": TOKEN})
    try:
        def observing() -> httpx.Response | None:
            found = httpx.get(f"{url}/v1/mode", timeout=10)
            return found if found.status_code == 409 and found.json().get("role") == "observer" else None

        assert "holds TP ranks 2, 3 of 4" in wait_for(observing, 60, "the sidecar to attach node 1").json()["detail"]
        for headers in ({"Authorization": f"Bearer {TOKEN}"}, {}):
            refused = httpx.put(f"{url}/v1/mode", json={"mode": "gather"}, headers=headers, timeout=10)
            assert refused.status_code == 409 and "TP rank 0's node" in refused.json()["detail"]
        assert httpx.get(f"{url}/readyz", timeout=10).json()["role"] == "observer"
        text = scrape(url)
        assert total(text, "gatherwise_sidecar_role", engine=ENGINE, role="observer") == 1
        assert total(text, "gatherwise_sidecar_role", engine=ENGINE, role="controller") == 0
        assert total(text, "gatherwise_calls_total", engine=ENGINE, rank="2") == 3
    finally:
        assert proc.stop() == 0
