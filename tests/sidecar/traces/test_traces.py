"""Traces from ring records: span tree, parents and exact timestamps (in memory), and a real OTLP/HTTP export
into a receiver started by the test — from real rings in-process, and from the real sidecar next to a real
TP=2 engine."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import EventBase, ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util.types import AnyValue

from gatherwise.config import TracesSection
from gatherwise.modes import Mode
from gatherwise.shm_format.ring import CallRecord
from gatherwise.sidecar.ingest.hooks_off import HooksOffWatch
from gatherwise.sidecar.ingest.poll import Ingest
from gatherwise.sidecar.metrics.record_histograms import RecordHistograms
from gatherwise.sidecar.traces.tracer import CallTracer, build_tracer, new_provider
from tests._otlp_receiver import OtlpReceiver
from tests._sidecar import start_engine, start_sidecar, wait_for
from tests.sidecar.ingest.test_sidecar_ingest import make_engine, write_call

OFFSET = 1_700_000_000_000_000_000


def traces_cfg(**overrides: object) -> TracesSection:
    base: dict[str, object] = dict(enabled=True, sample_ratio=0.0, every_nth=1, otlp_endpoint=None,
                                   service_name="gw-test")
    return TracesSection.model_validate({**base, **overrides})


def attrs(item: ReadableSpan | EventBase) -> Mapping[str, AnyValue]:
    """A span's or an event's attributes; every one the tracer makes carries some."""
    assert item.attributes is not None, f"{item.name} has no attributes"
    return item.attributes


def in_memory_tracer(**kw: Any) -> tuple[CallTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return CallTracer(new_provider("gw-test", SimpleSpanProcessor(exporter)), offset_ns=OFFSET, **kw), exporter


def record(rank: int, mode: Mode, t0: int) -> CallRecord:
    s = t0 + 700 * rank
    if mode == Mode.ALL_GATHER:
        return CallRecord(1, 42, int(mode), 3, 1000, "float32", rank, 5, 4096, s, s + 100, 5000, 0, 0, s + 5100,
                          3000, s + 9000)
    sample_ns = 3000 if rank == 0 else 0
    return CallRecord(1, 42, int(mode), 3, 1000, "float32", rank, 5, 2048, s, s + 100, 5000, s + 5100 + sample_ns,
                      2000, s + 5100, sample_ns, s + 5100 + sample_ns + 2500, second_op="broadcast")


def test_span_tree_parents_and_exact_timestamps() -> None:
    tracer, exporter = in_memory_tracer()
    recs = {r: record(r, Mode.GATHER, 10_000_000) for r in (0, 1)}
    trace_id = tracer.trace_call("00000000000000aa", 2, 42, recs)
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.name == "logits.call")
    assert root.parent is None and format(root.context.trace_id, "032x") == trace_id
    assert (root.start_time, root.end_time) == (10_000_000 + OFFSET, max(r.end_ns for r in recs.values()) + OFFSET)
    assert attrs(root)["gatherwise.mode"] == "gather" and attrs(root)["tp.size"] == 2
    children = [s for s in spans if s is not root]
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id
               and s.context.trace_id == root.context.trace_id for s in children)
    by_rank = {r: {s.name: s for s in children if attrs(s)["tp.rank"] == r} for r in (0, 1)}
    assert set(by_rank[0]) == {"gather", "sample", "broadcast", "logits_path"}
    assert set(by_rank[1]) == {"gather", "broadcast", "logits_path"}  # only rank 0 samples in gather mode
    for r, rec in recs.items():
        assert (by_rank[r]["gather"].start_time, by_rank[r]["gather"].end_time) == \
            (rec.collective_start_ns + OFFSET, rec.collective_start_ns + rec.collective_ns + OFFSET)
        assert (by_rank[r]["broadcast"].start_time, by_rank[r]["broadcast"].end_time) == \
            (rec.second_start_ns + OFFSET, rec.second_start_ns + rec.second_ns + OFFSET)
        assert (by_rank[r]["logits_path"].start_time, by_rank[r]["logits_path"].end_time) == \
            (rec.start_ns + OFFSET, rec.end_ns + OFFSET)
        gather = attrs(by_rank[r]["gather"])
        assert (gather["tp.rank"], gather["tp.size"], gather["gatherwise.mode"], gather["gatherwise.rows"],
                gather["gatherwise.bytes"], gather["gatherwise.epoch"]) == (r, 2, "gather", 3, 2048, 5)


def test_all_gather_call_has_sample_on_every_rank() -> None:
    tracer, exporter = in_memory_tracer()
    tracer.trace_call("00000000000000aa", 2, 42, {r: record(r, Mode.ALL_GATHER, 5_000) for r in (0, 1)})
    names = sorted((attrs(s).get("tp.rank", -1), s.name) for s in exporter.get_finished_spans())
    assert names == [(-1, "logits.call"), (0, "all_gather"), (0, "logits_path"), (0, "sample"),
                     (1, "all_gather"), (1, "logits_path"), (1, "sample")]


def test_sampling_every_nth_and_ratio() -> None:
    every5, _ = in_memory_tracer(every_nth=5, sample_ratio=0.0)
    assert [i for i in range(20) if every5.should_sample(i)] == [0, 5, 10, 15]
    always, _ = in_memory_tracer(every_nth=0, sample_ratio=1.0)
    never, _ = in_memory_tracer(every_nth=0, sample_ratio=0.0)
    assert all(always.should_sample(i) for i in range(50)) and not any(never.should_sample(i) for i in range(50))
    some, _ = in_memory_tracer(every_nth=0, sample_ratio=0.5)
    assert 0 < sum(some.should_sample(i) for i in range(400)) < 400


def test_trace_ids_follow_the_engine_and_call_never_a_seeded_global_rng() -> None:
    """Two sidecars (here two tracers, under different global seeds) give one call the same trace id; another call
    or another engine instance gets another. Spans of no call (mode switches) stay random per process even when
    the global RNG is seeded alike (TP ranks and tests seed it)."""
    ids, switches = [], []
    for seed in (1234, 99):
        random.seed(seed)
        tracer, _ = in_memory_tracer()
        ids.append([tracer.trace_call(engine, 1, call, {0: record(0, Mode.ALL_GATHER, 0)})
                    for engine, call in (("00000000000000aa", 0), ("00000000000000aa", 1), ("00000000000000ab", 0))])
        random.seed(1234)
        switches.append(tracer.mode_switch_event("00000000000000aa", reason="manual", from_table={}, to_table={}))
    assert ids[0] == ids[1] and len(set(ids[0])) == 3
    assert switches[0] != switches[1]


def test_mode_switch_event_carries_the_reason() -> None:
    tracer, exporter = in_memory_tracer()
    tracer.mode_switch_event("00000000000000aa", reason="auto", from_table={"1": "all_gather", "2": "all_gather"},
                             to_table={"1": "gather", "2": "all_gather"}, call_index=7,
                             evidence={"p50_gain": 0.12}, at_monotonic_ns=1000)
    (span,) = exporter.get_finished_spans()
    (event,) = span.events
    assert event.name == "mode.switch" and event.timestamp == 1000 + OFFSET
    assert attrs(event)["gatherwise.switch.reason"] == "auto"
    changed = attrs(event)["gatherwise.switch.changed"]
    assert isinstance(changed, Sequence) and list(changed) == ["1:all_gather->gather"]
    assert attrs(event)["gatherwise.evidence.p50_gain"] == 0.12


def test_build_tracer_from_config_and_otel_env() -> None:
    assert build_tracer(traces_cfg(enabled=False), env={}) is None
    assert build_tracer(traces_cfg(), env={}) is None  # nowhere to send spans: no tracing, no exemplars
    for tracer in (build_tracer(traces_cfg(), env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}),
                   build_tracer(traces_cfg(otlp_endpoint="http://127.0.0.1:9"), env={})):
        assert tracer is not None
        tracer.shutdown()


@pytest.mark.timeout(60)
def test_otlp_http_export_from_real_rings(tmp_path: Path) -> None:
    with OtlpReceiver() as receiver:
        tracer = build_tracer(traces_cfg(otlp_endpoint=receiver.url), env={})
        assert tracer is not None  # an OTLP endpoint is configured
        ingest = Ingest(tmp_path, RecordHistograms(), HooksOffWatch(tmp_path), tracer)
        rings = make_engine(tmp_path, 0xBEEF)
        t0 = time.monotonic_ns()
        for i in range(3):
            for r in rings:
                write_call(r, i, Mode.GATHER, 2, t0 + i * 100_000)
        ingest.poll_once()
        tracer.shutdown()  # flushes the BatchSpanProcessor
        assert ingest.engine is not None  # the poll attached to the engine it wrote
        readers = ingest.engine.readers
        spans = list(receiver.spans)
    records = {(rec.call_index, rec.rank): rec for rd in readers for rec in _reread(rd)}
    roots = [s for s in spans if s.name == "logits.call"]
    assert len(roots) == 3 and len({s.trace_id for s in roots}) == 3
    assert {s.service for s in spans} == {"gw-test"}
    for root in roots:
        call = root.attributes["gatherwise.call_index"]
        kids = [s for s in spans if s.trace_id == root.trace_id and s is not root]
        assert root.parent_span_id == "" and all(k.parent_span_id == root.span_id for k in kids)
        assert sorted(k.name for k in kids) == sorted(["gather", "sample", "broadcast", "logits_path",
                                                       "gather", "broadcast", "logits_path"])
        for k in kids:
            rec = records[(call, k.attributes["tp.rank"])]
            if k.name == "logits_path":
                assert (k.start_ns, k.end_ns) == (rec.start_ns + tracer.offset_ns, rec.end_ns + tracer.offset_ns)
            if k.name == "broadcast":
                assert k.start_ns == rec.second_start_ns + tracer.offset_ns
                assert k.end_ns - k.start_ns == rec.second_ns
        assert root.start_ns == min(records[(call, r)].start_ns for r in (0, 1)) + tracer.offset_ns
    # monotonic -> epoch: the spans sit at "now" on the wall clock
    assert abs(roots[0].start_ns - time.time_ns()) < 60e9


def _reread(reader):
    from gatherwise.sidecar.ingest.ring_reader import RingReader

    with RingReader(reader.path) as fresh:
        return fresh.read_new()[0]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sidecar_exports_traces_of_a_real_engine(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    (tmp_path / "engine.yaml").write_text("engine:\n  initial_mode: gather\n")
    with OtlpReceiver() as receiver:
        sidecar, url = start_sidecar(str(shm), env_extra={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                                                          "GATHERWISE_TRACES_EVERY_NTH": "10",
                                                          "GATHERWISE_TRACES_SAMPLE_RATIO": "0"})
        try:
            wall_start = time.time_ns()
            engine = start_engine(str(shm), duration=3, workload="fixed:2", config=str(tmp_path / "engine.yaml"))
            calls = int(engine.wait_line(r"(\d+) logits calls per rank", 150).group(1))
            assert engine.popen.wait(30) == 0
            wall_end = time.time_ns()
            wait_for(lambda: httpx.get(f"{url}/v1/engine", timeout=5).json()["calls_joined"] == calls, 30,
                     "every call joined")
        finally:
            assert sidecar.stop() == 0, "".join(sidecar.output)  # shutdown flushes the span queue
        spans = list(receiver.spans)
    roots = [s for s in spans if s.name == "logits.call"]
    assert {r.attributes["gatherwise.call_index"] for r in roots} == set(range(0, calls, 10))
    for root in roots:
        kids = [s for s in spans if s.trace_id == root.trace_id and s is not root]
        assert {(k.attributes["tp.rank"], k.name) for k in kids} == {
            (0, "gather"), (0, "sample"), (0, "broadcast"), (0, "logits_path"),
            (1, "gather"), (1, "broadcast"), (1, "logits_path")}
        assert all(k.parent_span_id == root.span_id for k in kids)
        assert all(root.start_ns <= k.start_ns <= k.end_ns <= root.end_ns for k in kids)
        assert wall_start <= root.start_ns <= root.end_ns <= wall_end
        assert root.service == "gatherwise-sidecar" and root.attributes["tp.size"] == 2
