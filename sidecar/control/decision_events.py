"""Where a published decision becomes visible: gatherwise_mode_switches_total and one trace span event.

The span event itself is gatherwise.sidecar.traces.tracer.CallTracer.mode_switch_event. The counter is built here,
unregistered; the composition root (gatherwise.sidecar.state) registers it with the other families.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from gatherwise.modes import IMPLEMENTED
from gatherwise.sidecar.metrics.names import MODE_SWITCHES

if TYPE_CHECKING:  # the GPU check imports the metrics modules without pydantic, which the policy needs
    from gatherwise.sidecar.policy.decision_log import Decision
    from gatherwise.sidecar.traces.tracer import CallTracer

log = logging.getLogger("gatherwise.sidecar.control")


class DecisionEvents:
    def __init__(self, tracer: CallTracer | None = None) -> None:
        self.tracer = tracer
        self.mode_switches = Counter(MODE_SWITCHES, "Buckets switched from one mode to another, by reason "
                                     "(manual, auto, probe, table_file).", ["engine", "from", "to", "reason"],
                                     registry=None)

    def decision(self, engine: str, d: Decision, call_index: int, counts: dict[str, int]) -> None:
        """Count every bucket that changed mode, and emit one span event for the decision."""
        for bucket in d.buckets:
            before = d.previous.get(bucket)
            if before is None or d.mode not in (m.label for m in IMPLEMENTED) or before == d.mode:
                continue
            self.mode_switches.labels(engine, before, d.mode, d.reason).inc()
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
            self.mode_switches.labels(engine, before, after, reason).inc(n)

    def forget(self) -> None:
        """Drop every switch series (the attached engine changed: its series must not mix with the next)."""
        self.mode_switches.clear()


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
