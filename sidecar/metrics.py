"""Every Prometheus family the sidecar exports, in one place (reference: docs/metrics.md).

The sidecar owns its own CollectorRegistry (not prometheus_client's multiprocess mode: that has no
exemplars). Histograms are fed from ring records by the ingest loop; the `*_total` counters and the engine
gauges are read at scrape time from the latest ring-header snapshot (sidecar.header_counters), so they are exact
even when records were overwritten before the sidecar read them, and they continue across sidecar restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from sidecar.histograms import HistogramFamily, HistogramsCollector, Series

# -- family names (the dashboards, alerts and checks use exactly these) ------------------------------------
COLLECTIVE_SECONDS = "gatherwise_collective_seconds"
SAMPLE_SECONDS = "gatherwise_sample_seconds"
LOGITS_PATH_SECONDS = "gatherwise_logits_path_seconds"
STEP_CRITICAL_PATH_SECONDS = "gatherwise_step_critical_path_seconds"
RANK_SKEW_SECONDS = "gatherwise_rank_skew_seconds"
COLLECTIVE_BYTES = "gatherwise_collective_bytes"  # exposed as ..._total
CALLS = "gatherwise_calls"  # exposed as ..._total
RECORDS_DROPPED = "gatherwise_records_dropped"  # exposed as ..._total
OP_SECONDS = "gatherwise_op_seconds"  # exposed as ..._total: the ring header's per-op time counters
LOGITS_PATH_BYTES = "gatherwise_logits_path_bytes"  # exposed as ..._total: the header's per-call bytes in total
ENGINE_UP = "gatherwise_engine_up"
ENGINE_HEARTBEAT_AGE_SECONDS = "gatherwise_engine_heartbeat_age_seconds"
# Control families (issue 4), fed by sidecar.controller:
MODE_SWITCHES = "gatherwise_mode_switches"  # exposed as ..._total
ACTIVE_MODE = "gatherwise_active_mode"
POLICY_ESTIMATE_SECONDS = "gatherwise_policy_estimate_seconds"

OPS = ("all_gather", "gather", "broadcast")
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
                                      "overwritten or torn before this sidecar read it, or timings the engine "
                                      "gave up (timing_backlog, timing_at_close; from the ring header).",
                                      labels=["engine", "rank", "reason"])
        seconds = CounterMetricFamily(OP_SECONDS, "Time spent in each op of the logits path, per rank and mode "
                                      "(ring header; op=logits_path is the whole path).",
                                      labels=["engine", "rank", "op", "mode"], unit="seconds")
        path_bytes = CounterMetricFamily(LOGITS_PATH_BYTES, "Bytes received by every collective of the logits "
                                         "path together, per rank and mode (ring header).",
                                         labels=["engine", "rank", "mode"], unit="bytes")
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
            up.add_metric([snap.engine], 1.0 if snap.up else 0.0)
            if snap.heartbeat_age_seconds is not None:
                age.add_metric([snap.engine], snap.heartbeat_age_seconds)
        yield from (calls, nbytes, seconds, path_bytes, dropped, up, age)


@dataclass
class RankSeries:
    """The histogram series one rank's record of one (mode, bucket) feeds; None where the op did not run."""

    collective: Series
    broadcast: Series | None
    sample: Series | None
    logits_path: Series


@dataclass
class CallSeries:
    """The cross-rank series of one (mode, bucket)."""

    critical_path: Series
    skew: Series


class SidecarMetrics:
    """The registry: record histograms (sidecar.histograms), header counters, and the control families."""

    def __init__(self, snapshot: Callable[[], EngineCounters | None] = lambda: None) -> None:
        disable_created_metrics()  # no *_created series: noise for dashboards (process-wide; the sidecar owns it)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.collective = HistogramFamily(COLLECTIVE_SECONDS, "Duration of each logits collective, per rank.",
                                          ["engine", "rank", "op", "mode", "bucket"], BUCKETS)
        self.sample = HistogramFamily(SAMPLE_SECONDS, "Duration of sampling on the ranks that sample.",
                                      ["engine", "rank", "mode", "bucket"], BUCKETS)
        self.logits_path = HistogramFamily(LOGITS_PATH_SECONDS, "Logits ready to tokens ready, per rank.",
                                           ["engine", "rank", "mode", "bucket"], BUCKETS)
        self.critical_path = HistogramFamily(
            STEP_CRITICAL_PATH_SECONDS, "Per call: last rank to arrive to last rank holding its tokens.",
            ["engine", "mode", "bucket"], BUCKETS)
        self.skew = HistogramFamily(RANK_SKEW_SECONDS, "Per call: latest minus earliest rank arrival.",
                                    ["engine", "mode", "bucket"], BUCKETS)
        self.histograms = (self.collective, self.sample, self.logits_path, self.critical_path, self.skew)
        r.register(HistogramsCollector(self.histograms))
        self.header_collector = HeaderCountersCollector(snapshot)
        r.register(self.header_collector)
        self._register_control_metrics()

    # -- control metrics (issue 4) ----------------------------------------------------------------------
    def _register_control_metrics(self) -> None:
        r = self.registry
        self.mode_switches = Counter(MODE_SWITCHES, "Buckets switched from one mode to another, by reason "
                                     "(manual, auto, probe, table_file).", ["engine", "from", "to", "reason"],
                                     registry=r)
        self.active_mode = Gauge(ACTIVE_MODE, "1 for the mode each bucket runs now (control block status), else 0.",
                                 ["engine", "bucket", "mode"], registry=r)
        self.policy_estimate = Gauge(POLICY_ESTIMATE_SECONDS, "The auto policy's windowed median critical path "
                                     "per bucket and mode.", ["engine", "bucket", "mode"], unit="seconds", registry=r)

    def forget_control(self) -> None:
        """Drop every control series (the attached engine changed: its series must not mix with the next)."""
        for family in (self.mode_switches, self.active_mode, self.policy_estimate):
            family.clear()

    # -- record histograms ----------------------------------------------------------------------------
    def rank_series(self, engine: str, rank: str, mode: str, bucket: str) -> RankSeries:
        """Series of one rank's calls in `mode` and `bucket`. In gather mode only rank 0 samples, and the
        tokens are broadcast; in all_gather mode every rank samples and nothing is broadcast."""
        gather = mode != "all_gather"
        op = "gather" if gather else "all_gather"
        return RankSeries(
            self.collective.series(engine, rank, op, mode, bucket),
            self.collective.series(engine, rank, "broadcast", mode, bucket) if gather else None,
            self.sample.series(engine, rank, mode, bucket) if rank == "0" or not gather else None,
            self.logits_path.series(engine, rank, mode, bucket))

    def call_series(self, engine: str, mode: str, bucket: str) -> CallSeries:
        return CallSeries(self.critical_path.series(engine, mode, bucket), self.skew.series(engine, mode, bucket))

    def forget_engine(self, engine: str) -> None:
        """Drop every histogram series of a previous engine instance (after an engine restart)."""
        for family in self.histograms:
            family.remove_where("engine", engine)

    # -- exposition -------------------------------------------------------------------------------------
    def exposition(self, accept_header: str | None) -> tuple[bytes, str]:
        """(body, content type): OpenMetrics with exemplars when the Accept header asks, classic text otherwise."""
        encoder, content_type = choose_encoder(accept_header or "")
        return encoder(self.registry), content_type
