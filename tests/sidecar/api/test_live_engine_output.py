"""GET /v1/live's engine output and history, in process: the model its rank info names and the newest sample from
files planted in a stand-in engine's directory (a bad or oversized sample is null, and nothing else changes), and
history points the sidecar takes on its own schedule, there before any page asks."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from gatherwise.config import GatherwiseConfig
from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.modes import Mode
from gatherwise.shm_format.engine_info import write_rank_info
from gatherwise.shm_format.engine_sample import MAX_SAMPLE_BYTES, EngineSample, sample_path, write_sample
from gatherwise.sidecar.api.app import create_app
from gatherwise.sidecar.ingest.live_history import LiveHistory
from gatherwise.sidecar.ingest.live_sample import live_sample
from gatherwise.sidecar.state import SidecarState, build_state
from lab.standins.engine import StandinEngine
from tests._sidecar import wait_for

MARKUP = '<img src=x onerror="alert(1)">'


def config_for(shm_dir: str) -> GatherwiseConfig:
    return GatherwiseConfig.model_validate({"engine": {"shm_dir": shm_dir}, "traces": {"enabled": False},
                                            "sidecar": {"poll_interval_seconds": 0.02}})


@pytest.fixture
def state(shm_dir: str, engine: StandinEngine) -> SidecarState:
    return build_state(config_for(shm_dir), env={})


def record_call(engine: StandinEngine, index: int) -> None:
    now = time.perf_counter_ns()
    engine.ring.record(CallMarks(index, Mode.ALL_GATHER, 3, 0, 4096, now, now + 100, now + 16_100, 0, 0,
                                 now + 16_100, now + 20_000, now + 21_000))


def test_live_serves_the_model_and_the_sample_from_the_engine_dir(state: SidecarState, engine: StandinEngine) -> None:
    write_rank_info(engine.dir, 0, "gatherwise reference engine", "1.0", {"all_gather": "every rank"},
                    model=f"SmolLM2 {MARKUP}")
    finished = time.time_ns() - 5_000_000_000
    write_sample(engine.dir, EngineSample(f"What is TP? {MARKUP}", "It splits the model.", 5, finished))
    record_call(engine, 0)
    with TestClient(create_app(state)) as client:
        body = wait_for(lambda: (b := client.get("/v1/live").json())["engine"] and b, 60, "the engine to attach")
    eng = body["engine"]
    assert eng["model"] == f"SmolLM2 {MARKUP}"  # the engine's text, as it wrote it: the page shows it as text
    assert eng["kind"] == "gatherwise reference engine" and eng["ranks"][0]["model"] == eng["model"]
    sample = body["sample"]
    assert set(sample) == {"prompt", "text", "tokens", "wall_ns", "age_seconds"}
    assert (sample["prompt"], sample["text"], sample["tokens"], sample["wall_ns"]) == \
        (f"What is TP? {MARKUP}", "It splits the model.", 5, finished)
    assert sample["age_seconds"] >= 5.0


def test_no_model_and_no_sample_are_null(state: SidecarState, engine: StandinEngine) -> None:
    write_rank_info(engine.dir, 0, "vLLM", "0.11", {})  # an engine that does not name its model
    with TestClient(create_app(state)) as client:
        body = wait_for(lambda: (b := client.get("/v1/live").json())["engine"] and b, 60, "the engine to attach")
    assert body["engine"]["model"] is None and body["engine"]["kind"] == "vLLM" and body["sample"] is None


@pytest.mark.parametrize("content", [
    b"{", b"[]", b'{"format": 2, "prompt": "p", "text": "t", "tokens": 1, "wall_ns": 1}',
    b'{"format": 1, "prompt": 7, "text": "t", "tokens": 1, "wall_ns": 1}',
    b'{"format": 1, "prompt": "p", "text": "t", "tokens": -1, "wall_ns": 1}', b"oversized"])
def test_a_bad_or_oversized_sample_is_null_and_nothing_else_breaks(state: SidecarState, engine: StandinEngine,
                                                                    content: bytes) -> None:
    write_rank_info(engine.dir, 0, "gatherwise reference engine", "1.0", {}, model="random")
    if content == b"oversized":  # a valid sample padded past the reader's limit
        content = EngineSample("p", "t", 1, 1).to_json() + b" " * MAX_SAMPLE_BYTES
    with open(sample_path(engine.dir), "wb") as f:
        f.write(content)
    record_call(engine, 0)
    with TestClient(create_app(state)) as client:
        body = wait_for(lambda: (b := client.get("/v1/live").json())["calls"] and b, 60, "the engine's calls")
    assert body["sample"] is None
    assert body["engine"]["model"] == "random" and body["calls"]["all_gather"] == 1


def test_a_linked_sample_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_bytes(EngineSample("p", "t", 1, 1).to_json())
    (tmp_path / "sample.json").symlink_to(target)
    assert live_sample(tmp_path) is None


def test_history_is_taken_on_the_sidecars_schedule_before_any_page_asks(state: SidecarState,
                                                                        engine: StandinEngine) -> None:
    stop = threading.Event()

    def calls() -> None:  # the stand-in engine's traffic, while the test waits
        index = 0
        while not stop.wait(0.005):
            record_call(engine, index)
            index += 1

    writer = threading.Thread(target=calls, daemon=True)
    writer.start()
    try:
        with TestClient(create_app(state)) as client:
            # the sidecar's loop runs (the app's lifespan); no request reaches /v1/live until the points are there
            wait_for(lambda: state.loop.call(lambda: len(state.live.points)) >= 2, 60, "two history points")
            first = client.get("/v1/live").json()
    finally:
        stop.set()
        writer.join()
    assert len(first["history"]) >= 2
    assert any(path["mode"] == "all_gather" and path["calls"] > 0 for p in first["history"] for path in p["paths"])


class FakeEngine:
    """What a history reading looks at: no call series and no readable ring (no calls, no share)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.call_series: dict[tuple[int, int], object] = {}
        self.readers: list[object] = []
        self.ranks, self.unreadable = [0], set[int]()


class FakeIngest:
    engine: FakeEngine | None = None


def test_a_point_per_interval_a_new_engine_starts_its_own_history_and_reading_takes_none():
    ingest, now = FakeIngest(), [0.0]
    history = LiveHistory(ingest, min_interval=1.0, clock=lambda: now[0], wall_clock=lambda: 1000 + now[0])  # type: ignore[arg-type]
    assert history.take() == float("inf") and history.newest(10) == (None, [])
    ingest.engine = FakeEngine("a")
    assert history.take() == 1.0 and history.newest(10) == ("a", [])  # the first reading: no interval yet
    now[0] = 0.5
    assert history.take() == 0.5 and not history.points  # not due
    for t in (1.0, 2.0, 3.0):
        now[0] = t
        assert history.take() == 1.0
    assert [p.time for p in history.newest(2)[1]] == [1002.0, 1003.0]
    now[0] = 10.0
    for _ in range(5):  # reading as often as it likes adds nothing
        history.newest(10)
    assert len(history.points) == 3
    ingest.engine = FakeEngine("b")
    assert history.newest(10) == ("b", [])  # the old engine's points are not the new one's
    assert history.take() == 1.0 and not history.points
