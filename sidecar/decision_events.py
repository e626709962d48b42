"""Where decisions and the control state become visible: Prometheus families and trace span events.

The switch counter is defined in sidecar.metrics (gatherwise_mode_switches_total); the control gauges are
computed at scrape time from the controller's view (sidecar.control_gauges); the span event is
sidecar.traces.CallTracer.mode_switch_event.
"""

from __future__ import annotations

import logging
from typing import Any

from gatherwise.modes import IMPLEMENTED
from sidecar.metrics import SidecarMetrics
from sidecar.policy import Decision

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
