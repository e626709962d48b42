"""`gatherwise_sidecar_role`: whether this sidecar controls the attached engine or observes it, as an enum gauge
(1 for its role, 0 for the other), so `gatherwise_sidecar_role{role="controller"} == 1` finds the one sidecar
of a TP group that may change the mode, on whichever node it runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gatherwise.sidecar.metrics.names import SIDECAR_ROLE


class RoleCollector(Collector):
    def __init__(self, role: Callable[[], tuple[str, str] | None], roles: Sequence[str]) -> None:
        """`role`: (engine label, role) of the attached engine, None while none is
        (gatherwise.sidecar.control.control_api.ControlApi.attached_role); `roles`: every role there is."""
        self.role, self.roles = role, tuple(roles)

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(SIDECAR_ROLE, "1 for this sidecar's role for the attached engine: controller "
                                   "(its node holds the control block and it holds the control lock) or observer.",
                                   labels=["engine", "role"])
        found = self.role()
        if found is not None:
            engine, current = found
            for role in self.roles:
                family.add_metric([engine, role], 1.0 if role == current else 0.0)
        yield family
