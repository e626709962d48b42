"""gatherwise_active_mode and gatherwise_policy_estimate_seconds, computed when /metrics is scraped.

Why at scrape time: setting prometheus_client Gauges for every bucket x mode at every policy step cost the
sidecar several % of a core next to an idle engine, for values read once per scrape. The view comes from the
control API (gatherwise.sidecar.control.control_api.ControlApi.control_view); its modes are the policy's (every
implemented mode).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gatherwise.sidecar.metrics.names import ACTIVE_MODE, POLICY_ESTIMATE_SECONDS


@dataclass
class ControlView:
    engine: str  # engine id, 16 hex digits
    active: dict[str, str]  # bucket label -> mode label the engine runs now
    modes: tuple[str, ...]  # every mode label the policy chooses among
    estimates: dict[tuple[str, str], float] = field(default_factory=dict)  # (bucket, mode) -> p50 seconds


class ControlGaugesCollector(Collector):
    def __init__(self, view: Callable[[], ControlView | None]) -> None:
        self.view = view

    def collect(self) -> Iterable[Metric]:
        active = GaugeMetricFamily(ACTIVE_MODE, "1 for the mode each bucket runs now (control block status), else 0.",
                                   labels=["engine", "bucket", "mode"])
        estimate = GaugeMetricFamily(POLICY_ESTIMATE_SECONDS, "The auto policy's windowed median cost per call "
                                     "(policy.cost: the step, or the critical path) per bucket and mode.",
                                     labels=["engine", "bucket", "mode"], unit="seconds")
        v = self.view()
        if v is not None:
            for bucket, running in v.active.items():
                for mode in v.modes:
                    active.add_metric([v.engine, bucket, mode], 1.0 if running == mode else 0.0)
            for (bucket, mode), p50 in v.estimates.items():
                estimate.add_metric([v.engine, bucket, mode], p50)
        yield from (active, estimate)
