"""Every Prometheus family the sidecar exports, in one place (reference: docs/metrics.md).

The sidecar owns its own CollectorRegistry (not prometheus_client's multiprocess mode: that has no
exemplars). Histograms are fed from ring records by the ingest loop; the `*_total` counters and the engine
gauges are read at scrape time from the latest ring-header snapshot (`rank_counters`): the engine writes them on
every call (calls and bytes at the time of the call, times once known), so they are exact even when records were
overwritten before the sidecar read them, and they continue across sidecar restarts.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gatherwise.sidecar.decision_events import ControlGaugesCollector
from gatherwise.sidecar.histograms import HistogramFamily, Series
from prometheus_client import CollectorRegistry, Counter, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from gatherwise.modes import IMPLEMENTED, Mode
from gatherwise.shm_format.hooks_off import HooksOffNotice
from gatherwise.shm_format.ring import MODE_OPS, RingHeader

# -- family names (the dashboards, alerts and checks use exactly these) ------------------------------------
COLLECTIVE_SECONDS = "gatherwise_collective_seconds"
SAMPLE_SECONDS = "gatherwise_sample_seconds"
LOGITS_PATH_SECONDS = "gatherwise_logits_path_seconds"
STEP_CRITICAL_PATH_SECONDS = "gatherwise_step_critical_path_seconds"
RANK_SKEW_SECONDS = "gatherwise_rank_skew_seconds"
COLLECTIVE_BYTES = "gatherwise_collective_bytes"  # exposed as ..._total
CALLS = "gatherwise_calls"  # exposed as ..._total
RECORDS_DROPPED = "gatherwise_records_dropped"  # exposed as ..._total
TOPP_ROWS = "gatherwise_topp_rows"  # exposed as ..._total
TOPP_FALLBACK_ROWS = "gatherwise_topp_fallback_rows"  # exposed as ..._total
OP_SECONDS = "gatherwise_op_seconds"  # exposed as ..._total: the ring header's per-op time counters
LOGITS_PATH_BYTES = "gatherwise_logits_path_bytes"  # exposed as ..._total: the header's per-call bytes in total
ENGINE_UP = "gatherwise_engine_up"
ENGINE_HEARTBEAT_AGE_SECONDS = "gatherwise_engine_heartbeat_age_seconds"
ENGINE_HOOKS_OFF = "gatherwise_engine_hooks_off"  # engine processes whose hooks are off (their notices)
# Control families, fed by gatherwise.sidecar.controller:
MODE_SWITCHES = "gatherwise_mode_switches"  # exposed as ..._total
# gatherwise_active_mode and gatherwise_policy_estimate_seconds: sidecar.decision_events (computed at scrape time)

OPS = tuple(op for pair in MODE_OPS.values() for op in pair if op)  # every collective op label, by mode
# 10 µs .. 1.3 s: collectives on one host are tens of µs (GPU) to tens of ms (gloo, big vocab).
BUCKETS = tuple(1e-5 * 2**i for i in range(18))


@dataclass
class RankCounters:
    """Cumulative counters of one rank, from its ring header (plus what this sidecar could not read)."""

    rank: int
    calls: dict[str, int] = field(default_factory=dict)  # mode label -> calls
    bytes: dict[tuple[str, str], int] = field(default_factory=dict)  # (op, mode label) -> bytes
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> records that never reached the histograms
    seconds: dict[tuple[str, str], float] = field(default_factory=dict)  # (op, mode label) -> seconds
    path_bytes: dict[str, int] = field(default_factory=dict)  # mode label -> bytes of every op of the path
    topp_rows: int = 0  # top-p rows sampled in sharded mode (every rank counts the same rows)
    topp_fallback_rows: int = 0  # of those, rows that took the full-row fallback


def bytes_series(modes: tuple[Mode, ...] = IMPLEMENTED) -> tuple[tuple[str, Mode], ...]:
    """(op, mode) pairs that move bytes: each mode's operations (MODE_OPS), e.g. gather runs gather + broadcast."""
    return tuple((op, m) for m in modes for op in MODE_OPS[int(m)] if op)


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
    path_bytes = {m.label: rows[int(m)].ops["path"].bytes for m in IMPLEMENTED}
    return RankCounters(rank, calls, nbytes, {**reader_dropped, **header.drops}, seconds, path_bytes,
                        header.topp_rows, header.topp_fallback_rows)


def total_calls(header: RingHeader) -> int:
    return sum(c.calls for c in header.counters.values())


@dataclass
class EngineCounters:
    """What the header collector exposes for the attached engine at scrape time."""

    engine: str  # engine id, 16 hex digits
    up: bool
    heartbeat_age_seconds: float | None
    ranks: list[RankCounters] = field(default_factory=list)


class HeaderCountersCollector(Collector):
    """Yields the `*_total` counters and engine gauges from the latest header snapshot."""

    def __init__(self, snapshot: Callable[[], EngineCounters | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot()
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
        path_bytes = CounterMetricFamily(LOGITS_PATH_BYTES, "Bytes received by every collective of the logits "
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
                for (op, mode), value in sorted(rc.seconds.items()):
                    seconds.add_metric([snap.engine, rank, op, mode], value)
                for mode, value in sorted(rc.path_bytes.items()):
                    path_bytes.add_metric([snap.engine, rank, mode], value)
                for reason, value in sorted(rc.dropped.items()):
                    dropped.add_metric([snap.engine, rank, reason], value)
            if snap.ranks:  # every rank decides the fallback identically and counts the same rows: rank 0 speaks
                topp.add_metric([snap.engine], snap.ranks[0].topp_rows)
                fallback.add_metric([snap.engine], snap.ranks[0].topp_fallback_rows)
            up.add_metric([snap.engine], 1.0 if snap.up else 0.0)
            if snap.heartbeat_age_seconds is not None:
                age.add_metric([snap.engine], snap.heartbeat_age_seconds)
        yield from (calls, nbytes, seconds, path_bytes, dropped, topp, fallback, up, age)


class HooksOffCollector(Collector):
    """Yields how many live engine processes say their hooks are off, by engine and reason (sidecar.hooks_off)."""

    def __init__(self, source: Callable[[], Sequence[HooksOffNotice]]) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(ENGINE_HOOKS_OFF, "Engine processes whose gatherwise hooks refused or never "
                                   "engaged, by engine and reason (their hooks-off notices).",
                                   labels=["engine_kind", "reason"])
        counts = collections.Counter((n.engine, n.reason) for n in self._source())
        for (engine, reason), count in sorted(counts.items()):
            family.add_metric([engine, reason], count)
        yield family


@dataclass
class CallSeries:
    """The series one (mode, bucket) feeds: per call (critical path, skew) and pooled over ranks (ops, sample).

    Why no rank label here: per-rank x per-bucket x per-mode histograms carry no decision (the policy compares
    modes per bucket on the critical path) and at TP=8 with three modes they alone were ~24 000 series. Where a
    rank matters (a straggler, a slow link) it shows without the bucket: gatherwise_logits_path_seconds per rank
    and mode, and the exact per-rank counters from the ring headers."""

    critical_path: Series
    skew: Series
    sample: Series
    first_op: Series  # the mode's first collective (MODE_OPS)
    second_ops: dict[str, Series]  # op name -> series, for the second operation a record names


class SidecarMetrics:
    """The registry: record histograms (gatherwise.sidecar.histograms), header counters, and the control families."""

    def __init__(self, snapshot: Callable[[], EngineCounters | None] = lambda: None,
                 hooks_off: Callable[[], Sequence[HooksOffNotice]] = tuple) -> None:
        disable_created_metrics()  # no *_created series: noise for dashboards (process-wide; the sidecar owns it)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.collective = HistogramFamily(
            COLLECTIVE_SECONDS, "Duration of each collective of the logits path, pooled over the ranks.",
            ["engine", "op", "mode", "bucket"], BUCKETS)
        self.sample = HistogramFamily(SAMPLE_SECONDS, "Duration of sampling, pooled over the ranks that sample.",
                                      ["engine", "mode", "bucket"], BUCKETS)
        self.logits_path = HistogramFamily(LOGITS_PATH_SECONDS, "Logits ready to tokens ready, per rank.",
                                           ["engine", "rank", "mode"], BUCKETS)
        self.critical_path = HistogramFamily(
            STEP_CRITICAL_PATH_SECONDS, "Per call: last rank to arrive to last rank holding its tokens.",
            ["engine", "mode", "bucket"], BUCKETS)
        self.skew = HistogramFamily(RANK_SKEW_SECONDS, "Per call: latest minus earliest rank arrival.",
                                    ["engine", "mode"], BUCKETS)
        # Rendered by exposition() itself (sidecar.histograms.HistogramFamily.render), not through the registry.
        self.histograms = (self.collective, self.sample, self.logits_path, self.critical_path, self.skew)
        self.header_collector = HeaderCountersCollector(snapshot)
        r.register(self.header_collector)
        r.register(HooksOffCollector(hooks_off))
        self._register_control_metrics()

    # -- control metrics ---------------------------------------------------------------------------------
    def _register_control_metrics(self) -> None:
        r = self.registry
        self.mode_switches = Counter(MODE_SWITCHES, "Buckets switched from one mode to another, by reason "
                                     "(manual, auto, probe, table_file).", ["engine", "from", "to", "reason"],
                                     registry=r)
        self.control_gauges = ControlGaugesCollector()  # the controller sets its view
        r.register(self.control_gauges)

    def forget_control(self) -> None:
        """Drop every control series (the attached engine changed: its series must not mix with the next)."""
        self.mode_switches.clear()

    # -- record histograms ----------------------------------------------------------------------------
    def rank_path(self, engine: str, rank: str, mode: str) -> Series:
        """Logits path of one rank in one mode (every bucket)."""
        return self.logits_path.series(engine, rank, mode)

    def call_series(self, engine: str, mode_code: int, bucket: str) -> CallSeries:
        mode = Mode(mode_code).label
        return CallSeries(self.critical_path.series(engine, mode, bucket), self.skew.series(engine, mode),
                          self.sample.series(engine, mode, bucket),
                          self.collective.series(engine, MODE_OPS[mode_code][0], mode, bucket), {})

    def second_op(self, engine: str, calls: CallSeries, op: str, mode: str, bucket: str) -> Series:
        found = calls.second_ops.get(op)
        if found is None:
            found = calls.second_ops[op] = self.collective.series(engine, op, mode, bucket)
        return found

    def forget_engine(self, engine: str) -> None:
        """Drop every histogram series of a previous engine instance (after an engine restart)."""
        for family in self.histograms:
            family.remove_where("engine", engine)

    # -- exposition -------------------------------------------------------------------------------------
    def exposition(self, accept_header: str | None) -> tuple[bytes, str]:
        """(body, content type): OpenMetrics with exemplars when the Accept header asks, classic text otherwise."""
        encoder, content_type = choose_encoder(accept_header or "")
        openmetrics = content_type.startswith("application/openmetrics-text")
        histograms = "".join(family.render(openmetrics) for family in self.histograms).encode()
        return histograms + encoder(self.registry), content_type  # the registry's part ends with `# EOF`
