"""Ingest loop on real rings (RingRecorder writer, RingReader reader), no engine: joins, metrics, restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.modes import Mode
from gatherwise.shm_format.ring import engine_dir, ring_path
from gatherwise.sidecar.ingest.hooks_off import HooksOffWatch
from gatherwise.sidecar.ingest.poll import Ingest
from gatherwise.sidecar.metrics.exposition import SidecarMetrics
from gatherwise.sidecar.metrics.header_counters import HeaderCountersCollector
from gatherwise.sidecar.metrics.record_histograms import RecordHistograms


class FakeClock:
    def __init__(self) -> None:
        self.now = 10**12

    def __call__(self) -> int:
        return self.now


def make_engine(shm: Path, engine_id: int, tp: int = 2, capacity: int = 64) -> list[RingRecorder]:
    Path(engine_dir(shm, engine_id)).mkdir(parents=True)
    return [RingRecorder(ring_path(shm, engine_id, r), engine_id=engine_id, rank=r, tp_size=tp, vocab=1000,
                         dtype="float32", capacity=capacity) for r in range(tp)]


def write_call(rec: RingRecorder, call_index: int, mode: Mode, rows: int, t0: int, fallback_rows: int = 0) -> None:
    """A call starting at t0 (+ rank * 1 µs); collective 5 µs, broadcast 2 µs in gather mode, sample 3 µs.
    Sharded: shard_exchange 5 µs, every rank computes 3 µs, shard_resolve 1 µs (512 bytes), `fallback_rows`."""
    s = t0 + rec.rank * 1000
    if mode == Mode.ALL_GATHER:
        rec.record(CallMarks(call_index, mode, rows, 0, 4096, s, s + 100, s + 5100, 0, 0, s + 5100, s + 8100,
                               s + 9000))
    elif mode == Mode.SHARDED:
        rec.record(CallMarks(call_index, mode, rows, 2, 96, s, s + 100, s + 5100, s + 8100, s + 9100, s + 5100,
                               s + 8100, s + 9500, resolve_nbytes=512, topp_rows=rows, fallback_rows=fallback_rows))
    else:
        ss = s + 5100
        se = ss + 3000 if rec.rank == 0 else ss
        rec.record(CallMarks(call_index, mode, rows, 1, 2048, s, s + 100, s + 5100, se, se + 2000, ss, se, se + 2500))


def ingest_with_metrics(shm: Path, **options: Any) -> tuple[SidecarMetrics, Ingest]:
    """An ingest of `shm` and a registry exporting what it reads, wired as the sidecar wires them."""
    histograms = RecordHistograms()
    ingest = Ingest(shm, histograms, HooksOffWatch(shm), **options)
    return SidecarMetrics(histograms, [HeaderCountersCollector(ingest.counters)]), ingest


def samples(metrics: SidecarMetrics) -> dict[tuple, float]:
    body, _ = metrics.exposition(None)
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples_: dict, name: str, **labels: str) -> float:
    return samples_[(name, tuple(sorted(labels.items())))]


def test_joins_ranks_and_exports_exact_counters(tmp_path: Path) -> None:
    clock = FakeClock()
    metrics, ingest = ingest_with_metrics(tmp_path, clock=clock, join_timeout=1.0)
    rings = make_engine(tmp_path, 0xABC)
    for i in range(10):
        for r in rings:
            write_call(r, i, Mode.ALL_GATHER if i < 6 else Mode.GATHER, 3, clock.now - 10**6 + i * 20000)
    assert ingest.poll_once().records == 20
    info = ingest.info()
    assert (info.engine_id, info.tp_size, info.calls_joined, info.calls_incomplete) == ("0000000000000abc", 2, 10, 0)
    got = samples(metrics)
    eng = "0000000000000abc"
    assert value(got, "gatherwise_calls_total", engine=eng, rank="1", mode="all_gather") == 6
    assert value(got, "gatherwise_calls_total", engine=eng, rank="0", mode="gather") == 4
    assert value(got, "gatherwise_collective_bytes_total", engine=eng, rank="0", op="gather", mode="gather") == 4 * 2048
    count = "gatherwise_collective_seconds_count"  # pooled over ranks: two observations per call
    assert value(got, count, engine=eng, op="all_gather", mode="all_gather", bucket="4") == 2 * 6
    assert value(got, count, engine=eng, op="broadcast", mode="gather", bucket="4") == 2 * 4
    # only rank 0 samples in gather mode
    assert value(got, "gatherwise_sample_seconds_count", engine=eng, mode="gather", bucket="4") == 4
    assert value(got, "gatherwise_sample_seconds_count", engine=eng, mode="all_gather", bucket="4") == 2 * 6
    assert value(got, "gatherwise_logits_path_seconds_count", engine=eng, rank="1", mode="gather") == 4
    # critical path: last arrival (rank 1, +1 µs) to last end; skew 1 µs
    crit = value(got, "gatherwise_step_critical_path_seconds_sum", engine=eng, mode="all_gather", bucket="4")
    assert abs(crit - 6 * 9000e-9) < 1e-12
    skew = value(got, "gatherwise_rank_skew_seconds_sum", engine=eng, mode="gather")
    assert abs(skew - 4 * 1000e-9) < 1e-12
    assert value(got, "gatherwise_engine_up", engine=eng) == 1
    assert value(got, "gatherwise_topp_fallback_rows_total", engine=eng) == 0


def test_sharded_calls_have_their_own_ops_and_fallback_counts(tmp_path: Path) -> None:
    """Sharded calls show as shard_exchange (+ shard_resolve when the call ran one), never as gather; the top-p
    fallback count comes from rank 0's header; every rank samples."""
    clock = FakeClock()
    metrics, ingest = ingest_with_metrics(tmp_path, clock=clock, join_timeout=1.0)
    rings = make_engine(tmp_path, 0x5D, tp=3)
    for i in range(5):
        for r in rings:
            write_call(r, i, Mode.SHARDED, 8, clock.now - 10**6 + i * 20000, fallback_rows=i % 2)
    assert ingest.poll_once().records == 15
    got = samples(metrics)
    eng = "000000000000005d"
    count = "gatherwise_collective_seconds_count"
    assert value(got, count, engine=eng, op="shard_exchange", mode="sharded", bucket="8") == 3 * 5
    assert value(got, count, engine=eng, op="shard_resolve", mode="sharded", bucket="8") == 3 * 5
    ops = {dict(labels)["op"] for (name, labels) in got if name == count}
    assert ops == {"shard_exchange", "shard_resolve"}
    assert value(got, "gatherwise_sample_seconds_count", engine=eng, mode="sharded", bucket="8") == 3 * 5
    assert value(got, "gatherwise_step_critical_path_seconds_count", engine=eng, mode="sharded", bucket="8") == 5
    assert value(got, "gatherwise_topp_rows_total", engine=eng) == 5 * 8
    assert value(got, "gatherwise_topp_fallback_rows_total", engine=eng) == 2


def test_incomplete_call_after_join_timeout(tmp_path: Path) -> None:
    clock = FakeClock()
    _, ingest = ingest_with_metrics(tmp_path, clock=clock, join_timeout=0.5)
    rings = make_engine(tmp_path, 0x1)
    write_call(rings[0], 0, Mode.ALL_GATHER, 1, clock.now)
    ingest.poll_once()
    assert ingest.info().calls_pending == 1
    clock.now += 10**9
    ingest.poll_once()
    info = ingest.info()
    assert (info.calls_pending, info.calls_incomplete, info.calls_joined) == (0, 1, 0)


def test_dropped_records_counted_and_calls_exact(tmp_path: Path) -> None:
    clock = FakeClock()
    metrics, ingest = ingest_with_metrics(tmp_path, clock=clock)
    rings = make_engine(tmp_path, 0x2, capacity=16)
    ingest.poll_once()
    for i in range(40):
        for r in rings:
            write_call(r, i, Mode.ALL_GATHER, 8, clock.now)
    ingest.poll_once()
    got = samples(metrics)
    assert value(got, "gatherwise_calls_total", engine="0000000000000002", rank="0", mode="all_gather") == 40
    dropped = {reason: value(got, "gatherwise_records_dropped_total", engine="0000000000000002", rank="0",
                             reason=reason) for reason in ("overwritten", "torn", "timing_backlog", "timing_at_close")}
    assert dropped["overwritten"] >= 40 - 16  # the reader also gives up the slot the writer may be rewriting
    assert dropped["torn"] == dropped["timing_backlog"] == dropped["timing_at_close"] == 0
    info = ingest.info()
    assert info.records_ingested + info.records_dropped == 2 * 40


def attached(tmp_path: Path, engine_id: int, discover_interval: float) -> tuple[FakeClock, SidecarMetrics, Ingest]:
    """An ingest that has attached a TP=2 engine which ran one all_gather call."""
    clock = FakeClock()
    metrics, ingest = ingest_with_metrics(tmp_path, clock=clock, discover_interval=discover_interval)
    for r in make_engine(tmp_path, engine_id):
        write_call(r, 0, Mode.ALL_GATHER, 1, clock.now)
    ingest.poll_once()
    return clock, metrics, ingest


def test_engine_restart_switches_without_mixing_series(tmp_path: Path) -> None:
    clock, metrics, ingest = attached(tmp_path, 0x10, discover_interval=0.0)
    assert ingest.info().engine_id == "0000000000000010"
    new = make_engine(tmp_path, 0x20)  # created later: newest
    for r in new:
        write_call(r, 0, Mode.GATHER, 2, clock.now)
    clock.now += 1
    ingest.poll_once()
    assert ingest.info().engine_id == "0000000000000020"
    engines = {dict(k[1]).get("engine") for k in samples(metrics)}
    assert engines == {"0000000000000020"}


def test_engine_is_down_as_soon_as_its_directory_is_removed(tmp_path: Path) -> None:
    """vLLM's workers exit without closing their rings and the engine's last process removes the directory:
    the very next scrape or API call says the engine is down, without waiting for a discovery pass."""
    import shutil

    _, metrics, ingest = attached(tmp_path, 0x30, discover_interval=3600.0)
    assert ingest.info().up
    shutil.rmtree(engine_dir(tmp_path, 0x30))  # the readers keep their open files
    info = ingest.info()
    assert info.attached and not info.up
    assert value(samples(metrics), "gatherwise_engine_up", engine="0000000000000030") == 0
