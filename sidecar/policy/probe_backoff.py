"""Probe back-off: how much longer than `probe_interval_seconds` a (bucket, mode) waits for its next probe.

A probe that finds the mode far behind (slower than the chosen one by more than `probe_backoff_margin`) doubles
the factor, up to `probe_backoff_max`, and so does one after which the bucket's paired evidence finds the mode
decisively slower by more than the switch `margin` (a mode 5-10 % behind would otherwise be probed every interval
for good); one that finds it close, with no such evidence, resets it to 1. A mode within the margin is not backed
off: it is the one a small change of load would make the faster, and with fewer fresh pairs beside them, probes
that noise made look promising would decide alone. When the chosen mode's own cost moves by more than
`probe_backoff_margin` from what it was when the bucket backed off (the load changed), or the bucket switches,
every factor of the bucket resets. So a mode that loses everywhere costs a few probes per
`probe_backoff_max` intervals, not `probe_budget` of all time, and a change of load is still noticed soon.
"""

from __future__ import annotations

from gatherwise.config import PolicyParams
from gatherwise.modes import Mode
from gatherwise.sidecar.policy.estimates import Estimate


class ProbeBackoff:
    """Interval factors per (bucket, mode) (absent: 1), and the chosen mode's cost when each bucket began
    backing off."""

    def __init__(self) -> None:
        self.factors: dict[tuple[int, Mode], float] = {}
        self.reference: dict[int, float] = {}

    def factor(self, bucket: int, mode: Mode) -> float:
        return self.factors.get((bucket, mode), 1.0)

    def after_probe(self, bucket: int, mode: Mode, ratio: float | None, chosen: Estimate | None,
                    params: PolicyParams, settled_slower: bool = False) -> float:
        """Back off a mode the probe found far behind (`ratio`: its cost / the chosen mode's; `chosen`: the
        chosen mode's cost now), or one the bucket's paired evidence, this probe included, finds decisively
        slower by more than the switch margin (`settled_slower`); reset one found close. Returns the new
        factor."""
        key = (bucket, mode)
        behind = ratio is not None and (ratio > 1.0 + params.probe_backoff_margin or settled_slower)
        if behind and chosen is not None:
            factor = min(self.factors.get(key, 1.0) * 2.0, max(1.0, params.probe_backoff_max))
            self.factors[key] = factor
            self.reference.setdefault(bucket, chosen.value)
            return factor
        self.factors.pop(key, None)
        if not any(k[0] == bucket for k in self.factors):
            self.reference.pop(bucket, None)
        return 1.0

    def load_moved(self, bucket: int, active: Estimate | None, params: PolicyParams) -> bool:
        """The chosen mode's cost moved away from where it was when the bucket backed off; resets the bucket and
        returns True (its modes should then be probed again soon)."""
        ref = self.reference.get(bucket)
        if ref is None or active is None:
            return False
        if abs(active.value - ref) > params.probe_backoff_margin * ref:
            self.reset(bucket)
            return True
        return False

    def reset(self, bucket: int) -> None:
        for key in [k for k in self.factors if k[0] == bucket]:
            del self.factors[key]
        self.reference.pop(bucket, None)
