"""`gatherwise_engine_hooks_off`: live engine processes whose hooks are off, by engine and reason
(their notices, watched by gatherwise.sidecar.ingest.hooks_off)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gatherwise.shm_format.hooks_off import HooksOffNotice
from gatherwise.sidecar.metrics.names import ENGINE_HOOKS_OFF


class HooksOffCollector(Collector):
    def __init__(self, notices: Callable[[], Sequence[HooksOffNotice]]) -> None:
        self.notices = notices

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(ENGINE_HOOKS_OFF, "Engine processes whose gatherwise hooks refused or never "
                                   "engaged, by engine and reason (their hooks-off notices).",
                                   labels=["engine_kind", "reason"])
        counts = collections.Counter((n.engine, n.reason) for n in self.notices())
        for (engine, reason), count in sorted(counts.items()):
            family.add_metric([engine, reason], count)
        yield family
