"""The auto policy: per bucket, run the mode with the lowest critical path; pins override it.

Pure decision logic, no I/O: the sidecar's loop feeds it samples (`observe`) and the monotonic time of every
call (`now`), and writes whatever `desired_table()` says into the control block. The only clock it reads is
`wall_clock` (unix seconds), to stamp its decisions. It chooses among any number
of modes (`modes`, default every implemented one). Rules:
- compare modes on costs measured at the same time, never on windows from different periods: the running mode
  of a busy bucket fills its window in a second or two while another mode is only measured by probes spread
  over minutes, and on a shared host the load moves the costs of both by more than the differences the policy
  looks for (comparing such windows made it switch back and forth on drift alone). So every probe yields one
  paired ratio, the probed mode's median over the probe divided by the running mode's median just before it,
  and a bucket switches to the mode whose median ratio over its recent probes (at least min_samples/probe_calls
  of them, none older than max_sample_age_seconds) is below 1 - `margin`. Probes of the running mode taken while
  another mode ran count too, inverted, so the evidence that made a bucket switch is the evidence against
  switching back. A mode whose first probes beat the running one is probed first until it has enough. Windows
  are compared directly only when the other mode's samples all fall within the running mode's window (both
  measured over the same period), with `min_samples` on both sides.
  A bucket never switches twice within `dwell_seconds`;
- keep the other modes' estimates fresh by probes: one (bucket, mode) at a time runs for `probe_calls` calls,
  and only while probe calls stay within `probe_budget` of all calls seen (calls that ran a mode other than the
  policy's choice count as probe calls);
- probes back off: a (bucket, mode) is probed every `probe_interval_seconds` x its back-off factor. A probe
  that finds the mode far behind (slower than the chosen one by more than `probe_backoff_margin`) doubles the
  factor, up to `probe_backoff_max`; one that finds it close resets it to 1. When the chosen mode's own cost
  moves by more than `probe_backoff_margin` from what it was when the bucket backed off (the load changed), or
  the bucket switches, every factor of the bucket resets and the bucket is probed again soon. So a mode that
  loses everywhere costs a few probes per `probe_backoff_max` intervals, not `probe_budget` of all calls;
- a pinned bucket (manual `PUT /v1/mode <mode>`) is never touched; `auto` releases the pin (back to the policy's
  own choice when its fresh probes had found the pinned mode slower, else from the pinned mode).
Every decision is returned with its evidence, and kept in a bounded log.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as validated_dataclass

from gatherwise.config import ModeOrAuto, PolicyParams
from gatherwise.modes import IMPLEMENTED, NUM_BUCKETS, Mode, ModeTable, bucket_label
from sidecar.estimates import Estimate, WindowEstimates

DECISION_LOG = 256
PAIRS_KEPT = 64  # paired ratios kept per bucket
Reason = Literal["manual", "auto", "probe", "table_file"]


# Also the item of GET /v1/decisions; a pydantic dataclass, so a decision is validated when made.
@validated_dataclass(config=ConfigDict(json_schema_serialization_defaults_required=True))
class Decision:
    """One decision of the policy's log, with its evidence."""

    id: int
    time: Annotated[float, Field(description="unix seconds (the policy's wall clock)")]
    reason: Reason
    mode: Annotated[ModeOrAuto, Field(description="the mode the buckets go to")]
    buckets: Annotated[list[str], Field(description='bucket labels ("1", "2", "4", ...)')]
    previous: Annotated[dict[str, str], Field(description="bucket -> mode before the decision (changed buckets)")]
    evidence: Annotated[dict[str, Any], Field(description="estimates, samples, margin (auto, probe); pins (manual)")
                        ] = field(default_factory=dict)
    command_seq: Annotated[int | None, Field(description="set once written to the control block")] = None


class Pair(NamedTuple):
    """One probe's evidence: the probed mode's median over the probe / the running (reference) mode's median
    just before it, both measured under the same load."""

    time: float
    probed: Mode
    reference: Mode
    ratio: float


@dataclass
class Probe:
    bucket: int
    mode: Mode
    started: float
    calls: int = 0


def should_switch(active: Estimate | None, challenger: Estimate | None, params: PolicyParams) -> bool:
    """True when the challenger is faster by the margin, with enough samples on both sides."""
    if active is None or challenger is None:
        return False
    if min(active.samples, challenger.samples) < params.min_samples:
        return False
    return challenger.value < active.value * (1.0 - params.margin)


class AutoPolicy:
    def __init__(self, params: PolicyParams, table: ModeTable, *, auto: bool,
                 modes: Sequence[Mode] | None = None, wall_clock: Callable[[], float] = time.time) -> None:
        self.params = params
        self.modes: tuple[Mode, ...] = tuple(IMPLEMENTED if modes is None else modes)
        self.choice: list[Mode] = list(table.modes)  # the policy's mode per bucket (probes aside)
        self.pins: dict[int, Mode] = {} if auto else dict(enumerate(table.modes))
        self.estimates = WindowEstimates(params.window, params.max_sample_age_seconds)
        self.last_switch: dict[int, float] = {}
        self.last_probe: dict[tuple[int, Mode], float] = {}
        self.backoff: dict[tuple[int, Mode], float] = {}  # probe interval factor (absent: 1)
        self.backoff_reference: dict[int, float] = {}  # chosen mode's cost when the bucket began backing off
        # bucket -> (time, probed mode, reference mode, probed cost / reference cost) of recent probes
        self.pairs: dict[int, deque[Pair]] = {}
        self.probe: Probe | None = None
        self.calls_total = 0
        self.probe_calls_used = 0
        self.decisions: deque[Decision] = deque(maxlen=DECISION_LOG)
        self.next_decision_id = 1
        self.wall_clock = wall_clock  # stamps decisions (Decision.time)
        self.restored_extra: dict[str, Any] = {}  # what the controller saved with the state (policy_state)

    # -- views ---------------------------------------------------------------------------------------------
    @property
    def policy_label(self) -> str:
        if not self.pins:
            return "auto"
        return "manual" if len(self.pins) == NUM_BUCKETS else "mixed"

    def learned_table(self) -> ModeTable:
        """The table without any probe: pins, and the policy's choice elsewhere."""
        return ModeTable(tuple(self.pins.get(b, self.choice[b]) for b in range(NUM_BUCKETS)))

    def desired_table(self) -> ModeTable:
        table = self.learned_table()
        if self.probe is not None:
            table = table.with_buckets(self.probe.mode, [self.probe.bucket])
        return table

    @property
    def probe_share(self) -> float:
        return self.probe_calls_used / self.calls_total if self.calls_total else 0.0

    def others(self, bucket: int) -> list[Mode]:
        return [m for m in self.modes if m != self.choice[bucket]]

    def probe_interval(self, bucket: int, mode: Mode) -> float:
        return self.params.probe_interval_seconds * self.backoff.get((bucket, mode), 1.0)

    @property
    def pairs_needed(self) -> int:
        """Probes (paired ratios) a mode needs before the policy switches to it: min_samples worth of calls."""
        return max(1, math.ceil(self.params.min_samples / self.params.probe_calls))

    def paired_ratio(self, bucket: int, mode: Mode, now: float) -> tuple[int, float] | None:
        """(probes, median ratio) of `mode` against the bucket's running mode, from fresh probes of `mode` taken
        while the running mode ran, and probes of the running mode taken while `mode` ran (inverted: that is
        the evidence for switching back). The newest 2 x probes_needed count, so old evidence phases out."""
        pairs = self.pairs.get(bucket)
        if not pairs:
            return None
        cutoff = now - self.params.max_sample_age_seconds
        while pairs and pairs[0].time < cutoff:
            pairs.popleft()
        running = self.choice[bucket]
        ratios = [p.ratio if p.probed == mode else 1.0 / p.ratio for p in pairs
                  if (p.probed, p.reference) in ((mode, running), (running, mode))]
        if not ratios:
            return None
        ratios = ratios[-2 * self.pairs_needed:]
        return len(ratios), statistics.median(ratios)

    # -- input ---------------------------------------------------------------------------------------------
    def observe(self, mode: Mode, bucket: int, seconds: float, now: float) -> bool:
        """One joined call of `bucket`. True when it completed the running probe (the caller may step at once, so
        a probe lasts `probe_calls` calls however long the loop waits between steps)."""
        if not math.isfinite(seconds) or seconds < 0:
            return False
        self.estimates.add(bucket, mode, seconds, now)
        self.calls_total += 1
        if bucket not in self.pins and mode != self.choice[bucket]:
            self.probe_calls_used += 1
        probe = self.probe
        if probe is not None and probe.bucket == bucket and mode == probe.mode:
            probe.calls += 1
            return probe.calls == self.params.probe_calls
        return False

    # -- decisions -----------------------------------------------------------------------------------------
    def _decide(self, reason: Reason, mode: str, buckets: Iterable[int], previous: dict[int, Mode],
                evidence: dict[str, Any]) -> Decision:
        """Log a decision: `buckets` go to `mode` (a mode label, or "auto" when pins are released)."""
        labels = [bucket_label(b) for b in buckets]
        decision = Decision(self.next_decision_id, self.wall_clock(), reason, mode, labels,
                            {bucket_label(b): m.label for b, m in previous.items()}, evidence)
        self.next_decision_id += 1
        self.decisions.append(decision)
        return decision

    def evidence(self, bucket: int, now: float) -> dict[str, Any]:
        paired = {}
        for m in self.others(bucket):
            found = self.paired_ratio(bucket, m, now)
            if found is not None:
                paired[m.label] = {"probes": found[0], "ratio": found[1]}
        return {"bucket": bucket_label(bucket), "margin": self.params.margin,
                "min_samples": self.params.min_samples, "probes_needed": self.pairs_needed,
                "estimates": {m.label: asdict(e) if (e := self.estimates.get(bucket, m, now)) else None
                              for m in self.modes},
                "paired": paired}

    def pin(self, mode: Mode, buckets: list[int] | None, now: float) -> Decision:
        chosen = list(range(NUM_BUCKETS)) if buckets is None else sorted(set(buckets))
        current = self.desired_table()
        previous = {b: current.modes[b] for b in chosen}
        for b in chosen:
            self.pins[b] = mode
        if self.probe is not None and self.probe.bucket in self.pins:
            self.probe = None
        return self._decide("manual", mode.label, chosen, previous, {"pinned": [bucket_label(b) for b in chosen]})

    def release(self, buckets: list[int] | None, now: float) -> Decision:
        """`auto` for these buckets: drop their pins. A bucket goes back to the mode the policy ran there before
        the pin when its paired probes had already found the pinned mode slower than that one (the evidence of
        the switch it made, still fresh: learning it again would cost probes at the pinned mode's price);
        otherwise the policy continues from the pinned mode."""
        chosen = list(range(NUM_BUCKETS)) if buckets is None else sorted(set(buckets))
        previous, returned = {}, {}
        for b in chosen:
            if b not in self.pins:
                continue
            pinned = previous[b] = self.pins.pop(b)
            found = self.paired_ratio(b, pinned, now) if pinned != self.choice[b] else None
            if found is not None and found[0] >= self.pairs_needed and found[1] > 1.0 + self.params.margin:
                returned[bucket_label(b)] = self.choice[b].label  # enough fresh probes found the pin slower
            else:
                self.choice[b] = pinned
            self._reset_backoff(b)
        return self._decide("manual", "auto", chosen, previous,
                            {"released": [bucket_label(b) for b in chosen], "returned": returned})

    def adopt_table(self, table: ModeTable, now: float, source: str) -> Decision | None:
        """Start auto buckets from a learned table (policy.table_file)."""
        changed = [b for b in range(NUM_BUCKETS) if b not in self.pins and self.choice[b] != table.modes[b]]
        decision = None
        for mode in self.modes:
            bs = [b for b in changed if table.modes[b] == mode]
            if bs:
                previous = {b: self.choice[b] for b in bs}
                for b in bs:
                    self.choice[b] = mode
                    self._reset_backoff(b)
                decision = self._decide("table_file", mode.label, bs, previous, {"source": source})
        return decision

    def step(self, now: float) -> list[Decision]:
        """End a finished probe, switch buckets whose evidence says so, maybe start a probe."""
        out: list[Decision] = []
        p = self.params
        if self.probe is not None and (self.probe.calls >= p.probe_calls
                                       or now - self.probe.started >= p.probe_timeout_seconds):
            probe, self.probe = self.probe, None
            backoff = self._after_probe(probe, now)
            out.append(self._decide("probe", self.choice[probe.bucket].label, [probe.bucket],
                                    {probe.bucket: probe.mode},
                                    {"phase": "end", "probe_calls": probe.calls, "backoff": backoff,
                                     **self.evidence(probe.bucket, now)}))
        for b in range(NUM_BUCKETS):
            if b in self.pins or (self.probe is not None and self.probe.bucket == b):
                continue
            active = self.choice[b]
            active_est = self.estimates.get(b, active, now)
            self._watch_load(b, active_est)
            if now - self.last_switch.get(b, -math.inf) < p.dwell_seconds:
                continue
            best = self._challenger(b, active_est, now)
            if best is not None:
                evidence = self.evidence(b, now)
                self.choice[b] = best
                self.last_switch[b] = now
                self._reset_backoff(b)
                out.append(self._decide("auto", best.label, [b], {b: active}, evidence))
        if self.probe is None:
            started = self._maybe_probe(now)
            if started is not None:
                out.append(started)
        return out

    def _challenger(self, b: int, active_est: Estimate | None, now: float) -> Mode | None:
        """The mode bucket b should switch to, if any: the lowest paired ratio below 1 - margin with enough
        probes, or else the lowest window median that beats the running mode's over the same period."""
        p = self.params
        best, best_ratio = None, 1.0 - p.margin
        for m in self.others(b):
            found = self.paired_ratio(b, m, now)
            if found is not None and found[0] >= self.pairs_needed and found[1] < best_ratio:
                best, best_ratio = m, found[1]
        if best is not None:
            return best
        active_span = self.estimates.span(b, self.choice[b])
        best_est = None
        for m in self.others(b):
            span = self.estimates.span(b, m)
            if span is None or active_span is None or span[0] < active_span[0]:
                continue  # the other mode has samples from before the running mode's window: not the same period
            e = self.estimates.get(b, m, now)
            if e is not None and e.samples >= p.min_samples and (best_est is None or e.value < best_est.value):
                best, best_est = m, e
        return best if best is not None and should_switch(active_est, best_est, p) else None

    # -- probes and their back-off -------------------------------------------------------------------------
    def _promising(self, bucket: int, mode: Mode, now: float) -> bool:
        found = self.paired_ratio(bucket, mode, now)
        return found is not None and found[0] < self.pairs_needed and found[1] < 1.0 - self.params.margin

    def _record_pair(self, probe: Probe, now: float) -> float | None:
        """The probe's paired ratio: its mode's median over the probe / the running mode's median just before."""
        if probe.calls < 1:
            return None
        probed = self.estimates.recent(probe.bucket, probe.mode, probe.calls)
        running = self.estimates.recent(probe.bucket, self.choice[probe.bucket], 2 * self.params.probe_calls,
                                        before=probe.started)
        if not probed or not running:
            return None
        base = statistics.median(running)
        if base <= 0:
            return None
        ratio = statistics.median(probed) / base
        pairs = self.pairs.get(probe.bucket)
        if pairs is None:
            pairs = self.pairs[probe.bucket] = deque(maxlen=PAIRS_KEPT)
        pairs.append(Pair(now, probe.mode, self.choice[probe.bucket], ratio))
        return ratio

    def _after_probe(self, probe: Probe, now: float) -> float:
        """Back off a mode the probe found far behind; reset one it found close. Returns the new factor."""
        key = (probe.bucket, probe.mode)
        ratio = self._record_pair(probe, now)
        chosen = self.estimates.get(probe.bucket, self.choice[probe.bucket], now)
        if ratio is not None and chosen is not None and ratio > 1.0 + self.params.probe_backoff_margin:
            factor = min(self.backoff.get(key, 1.0) * 2.0, max(1.0, self.params.probe_backoff_max))
            self.backoff[key] = factor
            self.backoff_reference.setdefault(probe.bucket, chosen.value)
            return factor
        self.backoff.pop(key, None)
        if not any(k[0] == probe.bucket for k in self.backoff):
            self.backoff_reference.pop(probe.bucket, None)
        return 1.0

    def _watch_load(self, bucket: int, active: Estimate | None) -> None:
        """The chosen mode's cost moved away from where it was when the bucket backed off: probe again soon."""
        ref = self.backoff_reference.get(bucket)
        if ref is None or active is None:
            return
        if abs(active.value - ref) > self.params.probe_backoff_margin * ref:
            self._reset_backoff(bucket)
            for m in self.modes:
                self.last_probe.pop((bucket, m), None)

    def _reset_backoff(self, bucket: int) -> None:
        for key in [k for k in self.backoff if k[0] == bucket]:
            del self.backoff[key]
        self.backoff_reference.pop(bucket, None)

    def _maybe_probe(self, now: float) -> Decision | None:
        p = self.params
        if p.probe_budget <= 0 or self.probe_calls_used + p.probe_calls > p.probe_budget * self.calls_total:
            return None
        candidates = []
        for b in range(NUM_BUCKETS):
            if b in self.pins:
                continue
            newest_active = self.estimates.newest(b, self.choice[b])
            if newest_active is None or now - newest_active > p.probe_timeout_seconds:
                continue  # no traffic in this bucket right now: a probe would measure nothing
            for m in self.others(b):
                if now - self.last_probe.get((b, m), -math.inf) < self.probe_interval(b, m):
                    continue
                newest_other = self.estimates.newest(b, m)
                candidates.append((0 if self._promising(b, m, now) else 1,
                                   -math.inf if newest_other is None else newest_other, b, int(m)))
        if not candidates:
            return None
        # a mode whose first probes beat the running one is confirmed first (a switch it earns is worth more
        # than any refresh); otherwise the (bucket, mode) measured longest ago
        _, _, b, code = min(candidates)
        mode = Mode(code)
        self.probe = Probe(b, mode, now)
        self.last_probe[(b, mode)] = now
        return self._decide("probe", mode.label, [b], {b: self.choice[b]},
                            {"phase": "start", "probe_calls": p.probe_calls, "probe_share": self.probe_share,
                             "backoff": self.backoff.get((b, mode), 1.0), **self.evidence(b, now)})

    def set_params(self, params: PolicyParams) -> None:
        self.params = params
        self.estimates.resize(params.window, params.max_sample_age_seconds)
