"""Where decisions and the control state become visible: Prometheus families and trace span events.

The switch counter is defined in gatherwise.sidecar.metrics (gatherwise_mode_switches_total); the span event is
sidecar.traces.CallTracer.mode_switch_event. gatherwise_active_mode and gatherwise_policy_estimate_seconds are
computed when /metrics is scraped, from the controller's view (ControlGaugesCollector): setting prometheus_client
Gauges for every bucket x mode at every policy step cost the sidecar several % of a core next to an idle engine,
for values read once per scrape. Their modes are the policy's (every implemented mode).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gatherwise.modes import IMPLEMENTED

if TYPE_CHECKING:  # sidecar.metrics registers the collector below (and the GPU check imports sidecar.metrics
    # without pydantic, which gatherwise.sidecar.policy needs): import these for type checks only
    from gatherwise.sidecar.metrics import SidecarMetrics
    from gatherwise.sidecar.policy import Decision

log = logging.getLogger("gatherwise.sidecar.control")


class DecisionEvents:
    def __init__(self, metrics: SidecarMetrics, tracer: Any | None = None) -> None:
        self.metrics, self.tracer = metrics, tracer

    def decision(self, engine: str, d: Decision, call_index: int, counts: dict[str, int]) -> None:
        """Count every bucket that changed mode, and emit one span event for the decision."""
        for bucket in d.buckets:
            before = d.previous.get(bucket)
            if before is None or d.mode not in (m.label for m in IMPLEMENTED) or before == d.mode:
                continue
            self.metrics.mode_switches.labels(engine, before, d.mode, d.reason).inc()
            key = f"{before}|{d.mode}|{d.reason}"
            counts[key] = counts.get(key, 0) + 1
        if self.tracer is None:
            return
        to_table = {b: d.mode for b in d.buckets}
        try:
            self.tracer.mode_switch_event(engine, reason=d.reason, from_table=d.previous, to_table=to_table,
                                          call_index=call_index, evidence=flatten(d.evidence, {"decision": d.id}))
        except Exception:  # a trace backend problem never blocks a decision
            log.exception("mode switch span event failed")

    def restore_switch_counts(self, engine: str, counts: dict[str, int]) -> None:
        """A restarted sidecar continues gatherwise_mode_switches_total from its saved state."""
        for key, n in counts.items():
            before, after, reason = key.split("|")
            self.metrics.mode_switches.labels(engine, before, after, reason).inc(n)

    def forget(self) -> None:
        self.metrics.forget_control()


def flatten(evidence: dict[str, Any], into: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"estimates": {"gather": {"p50": 1}}} -> {"estimates.gather.p50": 1}: span attributes are flat."""
    for key, value in evidence.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flatten(value, into, name + ".")
        elif value is None:
            continue
        elif isinstance(value, (list, tuple)):
            into[name] = ",".join(map(str, value))
        else:
            into[name] = value
    return into


ACTIVE_MODE = "gatherwise_active_mode"
POLICY_ESTIMATE_SECONDS = "gatherwise_policy_estimate_seconds"


@dataclass
class ControlView:
    engine: str  # engine id, 16 hex digits
    active: dict[str, str]  # bucket label -> mode label the engine runs now
    modes: tuple[str, ...]  # every mode label the policy chooses among
    estimates: dict[tuple[str, str], float] = field(default_factory=dict)  # (bucket, mode) -> p50 seconds


class ControlGaugesCollector(Collector):
    def __init__(self, view: Callable[[], ControlView | None] = lambda: None) -> None:
        self.view = view

    def collect(self) -> Iterable[Metric]:
        active = GaugeMetricFamily(ACTIVE_MODE, "1 for the mode each bucket runs now (control block status), else 0.",
                                   labels=["engine", "bucket", "mode"])
        estimate = GaugeMetricFamily(POLICY_ESTIMATE_SECONDS, "The auto policy's windowed median critical path "
                                     "per bucket and mode.", labels=["engine", "bucket", "mode"], unit="seconds")
        v = self.view()
        if v is not None:
            for bucket, running in v.active.items():
                for mode in v.modes:
                    active.add_metric([v.engine, bucket, mode], 1.0 if running == mode else 0.0)
            for (bucket, mode), p50 in v.estimates.items():
                estimate.add_metric([v.engine, bucket, mode], p50)
        yield from (active, estimate)
