"""The `*_total` counters and engine gauges, read at scrape time from the latest ring-header snapshot.

The engine writes its header counters on every call (calls and bytes at the time of the call, times once
known), so they are exact even when records were overwritten before the sidecar read them, and they continue
across sidecar restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gatherwise.modes import IMPLEMENTED, Mode
from gatherwise.shm_format.ring import MODE_OPS, RingHeader
from gatherwise.sidecar.metrics.names import (
    CALLS,
    COLLECTIVE_BYTES,
    ENGINE_HEARTBEAT_AGE_SECONDS,
    ENGINE_UP,
    LOGITS_PATH_BYTES,
    OP_SECONDS,
    RECORDS_DROPPED,
    TOPP_FALLBACK_ROWS,
    TOPP_ROWS,
)


@dataclass
class RankCounters:
    """Cumulative counters of one rank, from its ring header (plus what this sidecar could not read)."""

    rank: int
    calls: dict[str, int] = field(default_factory=dict)  # mode label -> calls
    bytes: dict[tuple[str, str], int] = field(default_factory=dict)  # (op, mode label) -> bytes
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> records that never reached the histograms
    seconds: dict[tuple[str, str], float] = field(default_factory=dict)  # (op, mode label) -> seconds
    logits_path_bytes: dict[str, int] = field(default_factory=dict)  # mode label -> bytes of every op of the path
    topp_rows: int = 0  # top-p rows sampled in sharded mode (every rank counts the same rows)
    topp_fallback_rows: int = 0  # of those, rows that took the full-row fallback


def bytes_series(modes: tuple[Mode, ...] = IMPLEMENTED) -> tuple[tuple[str, Mode], ...]:
    """(op, mode) pairs that move bytes: each mode's operations (MODE_OPS), e.g. gather runs gather + broadcast."""
    return tuple((op, m) for m in modes for op in MODE_OPS[m] if op)


def seconds_series(modes: tuple[Mode, ...] = IMPLEMENTED) -> tuple[tuple[str, Mode], ...]:
    """(op, mode) pairs that take time: the mode's collectives, sampling and the whole path."""
    return bytes_series(modes) + tuple((op, m) for m in modes for op in ("sample", "path"))


OP_LABELS = {"path": "logits_path"}  # header op name -> the `op` label (the path is labelled like its histogram)


def rank_counters(header: RingHeader, rank: int, reader_dropped: dict[str, int]) -> RankCounters:
    """One rank's counters. `reader_dropped`: this sidecar's own losses by reason (overwritten, torn); the
    engine's (timings given up) come from the header."""
    rows = header.counters
    calls = {m.label: rows[int(m)].calls for m in IMPLEMENTED}
    nbytes = {(op, m.label): rows[int(m)].ops[op].bytes for op, m in bytes_series()}
    seconds = {(OP_LABELS.get(op, op), m.label): rows[int(m)].ops[op].ns / 1e9 for op, m in seconds_series()}
    logits_path_bytes = {m.label: rows[int(m)].ops["path"].bytes for m in IMPLEMENTED}
    return RankCounters(rank, calls, nbytes, {**reader_dropped, **header.drops}, seconds, logits_path_bytes,
                        header.topp_rows, header.topp_fallback_rows)


def total_calls(header: RingHeader) -> int:
    return sum(c.calls for c in header.counters.values())


@dataclass
class EngineCounters:
    """What the header collector exposes for the attached engine at scrape time."""

    engine: str  # engine id, 16 hex digits
    up: bool
    newest_record_age_seconds: float | None  # the engine heartbeat gauge: since the newest call ended
    ranks: list[RankCounters] = field(default_factory=list)


class HeaderCountersCollector(Collector):
    """Yields the `*_total` counters and engine gauges from the latest header snapshot."""

    def __init__(self, snapshot: Callable[[], EngineCounters | None]) -> None:
        """`snapshot`: the attached engine's counters now (gatherwise.sidecar.ingest.poll.Ingest.counters)."""
        self.snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot()
        calls = CounterMetricFamily(CALLS, "Logits calls completed, per rank and mode (ring header).",
                                    labels=["engine", "rank", "mode"])
        nbytes = CounterMetricFamily(COLLECTIVE_BYTES, "Bytes received by each collective (ring header).",
                                     labels=["engine", "rank", "op", "mode"], unit="bytes")
        dropped = CounterMetricFamily(RECORDS_DROPPED, "Calls whose record never reached the histograms, by reason: "
                                      "overwritten or torn before this sidecar read it, invalid (a field out of "
                                      "its range), or timings the engine gave up (timing_backlog, timing_at_close; "
                                      "from the ring header).",
                                      labels=["engine", "rank", "reason"])
        seconds = CounterMetricFamily(OP_SECONDS, "Time spent in each op of the logits path, per rank and mode "
                                      "(ring header; op=logits_path is the whole path).",
                                      labels=["engine", "rank", "op", "mode"], unit="seconds")
        logits_path_bytes = CounterMetricFamily(LOGITS_PATH_BYTES, "Bytes received by every collective of the logits "
                                         "path together, per rank and mode (ring header).",
                                         labels=["engine", "rank", "mode"], unit="bytes")
        topp = CounterMetricFamily(TOPP_ROWS, "Top-p rows (without top-k) sampled in sharded mode (ring header).",
                                   labels=["engine"])
        fallback = CounterMetricFamily(TOPP_FALLBACK_ROWS, "Of those, rows whose nucleus the exchanged candidates "
                                       "did not cover: sampled by the full-row fallback (ring header).",
                                       labels=["engine"])
        up = GaugeMetricFamily(ENGINE_UP, "1 while the attached engine's heartbeat is fresh.", labels=["engine"])
        age = GaugeMetricFamily(ENGINE_HEARTBEAT_AGE_SECONDS, "Seconds since the engine last completed a call.",
                                labels=["engine"], unit="seconds")
        if snap is not None:
            for rc in snap.ranks:
                rank = str(rc.rank)
                for mode, value in sorted(rc.calls.items()):
                    calls.add_metric([snap.engine, rank, mode], value)
                for (op, mode), value in sorted(rc.bytes.items()):
                    nbytes.add_metric([snap.engine, rank, op, mode], value)
                for (op, mode), secs in sorted(rc.seconds.items()):
                    seconds.add_metric([snap.engine, rank, op, mode], secs)
                for mode, value in sorted(rc.logits_path_bytes.items()):
                    logits_path_bytes.add_metric([snap.engine, rank, mode], value)
                for reason, value in sorted(rc.dropped.items()):
                    dropped.add_metric([snap.engine, rank, reason], value)
            # every rank decides the fallback identically and counts the same rows: rank 0 speaks, so the sidecar of
            # every other node of a multi-node group leaves them out (a sum over the sidecars counts them once)
            if snap.ranks and snap.ranks[0].rank == 0:
                topp.add_metric([snap.engine], snap.ranks[0].topp_rows)
                fallback.add_metric([snap.engine], snap.ranks[0].topp_fallback_rows)
            up.add_metric([snap.engine], 1.0 if snap.up else 0.0)
            if snap.newest_record_age_seconds is not None:
                age.add_metric([snap.engine], snap.newest_record_age_seconds)
        yield from (calls, nbytes, seconds, logits_path_bytes, dropped, topp, fallback, up, age)
