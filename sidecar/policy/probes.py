"""Probes: running another mode on one bucket for a few calls, to measure it against the running mode under the
same load. Which bucket and mode to probe next, what a probe records, and when it ends. Pure, no I/O.

- Probes go where the time is: among the buckets due a probe, the one whose calls take most of the engine's time
  lately (call rate x running cost) is probed first, so a bucket of a few slow calls between batches cannot
  spend the budget a busy bucket's switch would earn.
- A mode whose first probes beat the running one is probed again as soon as the running mode has fresh calls to
  compare with; any other (bucket, mode) every `probe_interval_seconds` x its back-off factor
  (sidecar.policy.probe_backoff).
- A probe ends after `probe_calls` calls, or earlier once every kind it saw is decisive either way, once the
  budget is spent (sidecar.policy.probe_budget), after `probe_timeout_seconds`, or when the bucket's traffic stops.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gatherwise.config import PolicyParams
from gatherwise.modes import Mode
from gatherwise.sidecar.policy.auto_choice import AutoChoice
from gatherwise.sidecar.policy.bucket_traffic import BucketTraffic, cell
from gatherwise.sidecar.policy.estimates import Estimate
from gatherwise.sidecar.policy.paired_evidence import decisive, pair_stats
from gatherwise.sidecar.policy.probe_backoff import ProbeBackoff
from gatherwise.sidecar.policy.probe_budget import ProbeBudget

MIN_PROBE_CALLS = 3  # calls before a probe may end early on decisive evidence


@dataclass
class Probe:
    bucket: int
    mode: Mode
    started: float
    calls: int = 0
    samples: dict[int, list[float]] = field(default_factory=dict)  # kind -> seconds of the probe's calls
    references: dict[int, list[float]] = field(default_factory=dict)  # kind -> the running mode's, just before
    extra: float = 0.0  # seconds its calls took beyond the running mode's cost for them, signed

    def settled(self) -> bool:
        """Every kind the probe saw is decisive either way against its reference: more calls add nothing."""
        for kind, samples in self.samples.items():
            found = pair_stats(samples, self.references.get(kind, ()))
            if found is None or not decisive(math.log(found[0]), found[1]):
                return False
        return True


class Probes:
    """The running probe (at most one), when each (bucket, mode) was last probed, the budget and the back-off."""

    def __init__(self, params: PolicyParams, modes: Sequence[Mode], traffic: BucketTraffic) -> None:
        self.params = params
        self.modes = tuple(modes)
        self.traffic = traffic
        self.probe: Probe | None = None
        self.last_probe: dict[tuple[int, Mode], float] = {}
        self.last_probe_end: dict[int, float] = {}
        self.running_since_probe: dict[int, int] = {}  # bucket -> calls named the running mode since its last probe
        self.budget = ProbeBudget()
        self.backoff = ProbeBackoff()

    def interval(self, bucket: int, mode: Mode) -> float:
        return self.params.probe_interval_seconds * self.backoff.factor(bucket, mode)

    def _open_extra(self) -> float | None:
        return None if self.probe is None else self.probe.extra

    def over_budget(self) -> bool:
        return self.budget.over(self.params.probe_budget, self._open_extra())

    @property
    def call_share(self) -> float:
        return self.budget.call_share

    @property
    def cost_share(self) -> float:
        return self.budget.cost_share(self._open_extra())

    # -- calls ---------------------------------------------------------------------------------------------
    def observe(self, bucket: int, named: Mode, kind: int, seconds: float, now: float, *, running: Mode,
                pinned: bool) -> bool:
        """Count one call of the bucket (after BucketTraffic.add) whose table named `named` while the policy runs
        `running` there; True when it ended the running probe."""
        self.budget.count_call(seconds)
        probe = self.probe
        if named == running:
            self.running_since_probe[bucket] = self.running_since_probe.get(bucket, 0) + 1
        elif not pinned:
            self.budget.count_probe_call()
            extra = seconds - self.traffic.running_cost(bucket, kind, running, seconds, now)
            if probe is not None and probe.bucket == bucket and named == probe.mode:
                probe.extra += extra  # charged net when the probe ends: noise around an equal cost adds nothing
            else:
                self.budget.charge(extra)  # a call whose table had not caught up yet
        if probe is None or probe.bucket != bucket or named != probe.mode:
            return False
        probe.calls += 1
        if kind not in probe.references:
            probe.references[kind] = self.traffic.kind_estimates.recent(
                cell(bucket, kind), running, 2 * self.params.probe_calls, before=probe.started)
        probe.samples.setdefault(kind, []).append(seconds)
        return (probe.calls >= self.params.probe_calls or self.over_budget()
                or (probe.calls >= MIN_PROBE_CALLS and probe.settled()))

    # -- ending --------------------------------------------------------------------------------------------
    def due_to_end(self, now: float) -> bool:
        probe, p = self.probe, self.params
        return probe is not None and (
            probe.calls >= p.probe_calls or now - probe.started >= p.probe_timeout_seconds or self.over_budget()
            or self.traffic.quiet(probe.bucket, now) or (probe.calls >= MIN_PROBE_CALLS and probe.settled()))

    def cancel(self) -> None:
        """Stop the running probe (its bucket was pinned), charging what it took."""
        probe = self.probe
        if probe is not None:
            self.budget.charge(probe.extra)
            self.probe = None

    def finish(self, now: float) -> Probe:
        """End the running probe (there must be one) and return it: its bucket needs fresh calls of the running
        mode before another probe can be compared with them."""
        probe = self.probe
        if probe is None:
            raise RuntimeError("no probe to finish")
        self.cancel()
        self.last_probe_end[probe.bucket] = now
        self.running_since_probe[probe.bucket] = 0
        return probe

    def after_probe(self, probe: Probe, ratio: float | None, chosen: Estimate | None, settled_slower: bool) -> float:
        """Back off or reset the probed mode from the probe's ratio and the bucket's paired evidence; returns its
        new factor."""
        return self.backoff.after_probe(probe.bucket, probe.mode, ratio, chosen, self.params, settled_slower)

    def watch_load(self, bucket: int, active: Estimate | None) -> None:
        """The chosen mode's cost moved away from where it was when the bucket backed off: probe again soon."""
        if self.backoff.load_moved(bucket, active, self.params):
            for m in self.modes:
                self.last_probe.pop((bucket, m), None)

    # -- starting ------------------------------------------------------------------------------------------
    def fresh_reference(self, bucket: int) -> bool:
        """The running mode ran enough calls since the bucket's last probe for a new probe to compare with."""
        return bucket not in self.last_probe_end or self.running_since_probe.get(bucket, 0) >= MIN_PROBE_CALLS

    def start_next(self, buckets: Iterable[int], choice: AutoChoice, now: float) -> Probe | None:
        """Start the probe due first among `buckets` (those not pinned), if the budget allows one."""
        if self.params.probe_budget <= 0 or self.over_budget():
            return None
        estimates = self.traffic.estimates
        candidates = []
        for b in buckets:
            running = choice.choice[b]
            if estimates.newest(b, running) is None or self.traffic.quiet(b, now):
                continue  # no traffic in this bucket right now: a probe would measure nothing
            weight = -self.traffic.time_share(b, running, now)
            for m in choice.others(b):
                promising = choice.promising(b, m, now)
                if promising is not None:  # confirm it as soon as there is a fresh reference to compare with
                    if not self.fresh_reference(b):
                        continue
                    candidates.append((weight, 0, promising, b, int(m)))
                    continue
                if now - self.last_probe.get((b, m), -math.inf) < self.interval(b, m):
                    continue
                newest_other = estimates.newest(b, m)
                candidates.append((weight, 1, -math.inf if newest_other is None else newest_other, b, int(m)))
        if not candidates:
            return None
        # the bucket that takes most of the engine's time first: the budget goes where a switch gains most (a
        # bucket of a few slow calls between batches must not spend it all); within a bucket, a mode whose first
        # probes beat the running one is confirmed first, the most promising first, otherwise the mode measured
        # longest ago
        *_, b, code = min(candidates)
        mode = Mode(code)
        self.probe = Probe(b, mode, now)
        self.last_probe[(b, mode)] = now
        return self.probe
