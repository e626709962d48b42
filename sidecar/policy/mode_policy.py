"""The sidecar's mode policy (ModePolicy): manual pins where set; elsewhere the auto choice: per bucket, run the
mode whose calls cost least (what a call costs is sidecar.call_costs': its step by default, `policy.cost`).

Pure decision logic, no I/O: the sidecar's loop feeds it samples (`observe`) and the monotonic time of every
call (`now`), and writes whatever `desired_table()` says into the control block. The only clock it reads is
`wall_clock` (unix seconds), to stamp its decisions. It chooses among any number
of modes (`modes`, default every implemented one). Rules:
- compare modes on costs measured at the same time, never on windows from different periods: the running mode
  of a busy bucket fills its window in a second or two while another mode is only measured by probes spread
  over minutes, and on a shared host the load moves the costs of both by more than the differences the policy
  looks for (comparing such windows made it switch back and forth on drift alone). So every probe yields paired
  evidence (sidecar.paired_evidence): per call kind, the probed mode's median over the probe against the running
  mode's median just before it;
- compare like with like: a call's kind (what it samples, gatherwise.call_kind) moves its cost far more than its
  mode does, so pairs never mix kinds, and a bucket's ratio for a mode weights each kind by the share of the
  bucket's time it takes. A call is charged to the mode its table named (a call that stepped aside from
  sharded to the engine's all_gather is what sharded costs that kind of call);
- decide as soon as the evidence is decisive: a bucket switches to the mode whose mix-weighted ratio is below
  1 - `margin` and below 1 by Z standard errors, from at least two probes. Probes of the running mode taken
  while another mode ran count too, inverted, so the evidence that made a bucket switch is the evidence against
  switching back. A mode whose first probes beat the running one is probed again as soon as the running mode has
  fresh calls to compare with. A probe ends after `probe_calls` calls, or earlier once every kind it saw is
  decisive either way. Windows are compared directly only when the bucket's calls are all of one kind and the
  other mode's samples all fall within the running mode's window, with `min_samples` on both sides.
  A bucket never switches twice within `dwell_seconds`;
- probes go where the time is: among the buckets due a probe, the one whose calls take most of the engine's
  time lately (call rate x running cost) is probed first, so a bucket of a few slow calls between batches
  cannot spend the budget a busy bucket's switch would earn;
- probes cost what they add: `probe_budget` bounds the seconds probe calls took beyond what the running mode
  would have taken for them (same bucket, same kind), as a share of all seconds observed, counted per probe
  net of its calls: on a noisy host half of an equal mode's calls run over the running median and half under,
  and charging only the ones over spent the budget on noise before a faster mode could be confirmed. A probe
  of a faster mode is free; one of a slower mode ends the moment the budget is spent, however slow its calls;
- probes back off: a (bucket, mode) is probed every `probe_interval_seconds` x its back-off factor. A probe
  that finds the mode far behind (slower than the chosen one by more than `probe_backoff_margin`) doubles the
  factor, up to `probe_backoff_max`; one that finds it close resets it to 1. When the chosen mode's own cost
  moves by more than `probe_backoff_margin` from what it was when the bucket backed off (the load changed), or
  the bucket switches, every factor of the bucket resets and the bucket is probed again soon. So a mode that
  loses everywhere costs a few probes per `probe_backoff_max` intervals, not `probe_budget` of all time;
- a pinned bucket (manual `PUT /v1/mode <mode>`) is never touched; `auto` releases the pin (back to the policy's
  own choice when its fresh probes had found the pinned mode slower, else from the pinned mode).
Every decision is returned with its evidence, and kept in a bounded log.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as validated_dataclass

from gatherwise.call_kind import KINDS, kind_label, split_tag
from gatherwise.config import ModeOrAuto, PolicyParams
from gatherwise.modes import IMPLEMENTED, NUM_BUCKETS, Mode, ModeTable, bucket_label
from gatherwise.sidecar.policy.estimates import Estimate, KindMix, WindowEstimates
from gatherwise.sidecar.policy.paired_evidence import Evidence, Pair, combine_kind, combine_mix, decisive, pair_stats

DECISION_LOG = 256
PAIRS_KEPT = 64  # paired ratios kept per bucket
MIN_PROBES = 2  # probes behind a switch: one probe can coincide with a load step between it and its reference
MIN_PROBE_CALLS = 3  # calls before a probe may end early on decisive evidence
ARRIVALS_KEPT = 16  # call times kept per bucket, for its recent gap between calls
QUIET_SECONDS = 1.0  # a bucket without calls for this long (or 4 gaps) is not probed
Reason = Literal["manual", "auto", "probe", "table_file"]


def cell(bucket: int, kind: int) -> int:
    """The key of a (bucket, call kind) sample window."""
    return bucket * KINDS + kind


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


@dataclass
class Probe:
    bucket: int
    mode: Mode
    started: float
    calls: int = 0
    samples: dict[int, list[float]] = field(default_factory=dict)  # kind -> seconds of the probe's calls
    references: dict[int, list[float]] = field(default_factory=dict)  # kind -> the running mode's, just before
    extra: float = 0.0  # seconds its calls took beyond the running mode's cost for them, signed


def should_switch(active: Estimate | None, challenger: Estimate | None, params: PolicyParams) -> bool:
    """True when the challenger is faster by the margin, with enough samples on both sides."""
    if active is None or challenger is None:
        return False
    if min(active.samples, challenger.samples) < params.min_samples:
        return False
    return challenger.value < active.value * (1.0 - params.margin)


class ModePolicy:
    """The mode of every bucket: a manual pin where one is set (`pin`, `release`), the auto choice elsewhere."""

    def __init__(self, params: PolicyParams, table: ModeTable, *, auto: bool,
                 modes: Sequence[Mode] | None = None, wall_clock: Callable[[], float] = time.time) -> None:
        self.params = params
        self.modes: tuple[Mode, ...] = tuple(IMPLEMENTED if modes is None else modes)
        self.choice: list[Mode] = list(table.modes)  # the policy's mode per bucket (probes aside)
        self.pins: dict[int, Mode] = {} if auto else dict(enumerate(table.modes))
        self.estimates = WindowEstimates(params.window, params.max_sample_age_seconds)  # by the mode that ran
        # by (bucket, kind) cell and the mode the call's table named: what pairs and probe costs compare
        self.kind_estimates = WindowEstimates(params.window, params.max_sample_age_seconds)
        self.mix: dict[int, KindMix] = {}  # bucket -> kinds of its newest `window` calls
        self.last_switch: dict[int, float] = {}
        self.last_probe: dict[tuple[int, Mode], float] = {}
        self.last_probe_end: dict[int, float] = {}
        self.arrivals: dict[int, deque[float]] = {}  # bucket -> times of its newest calls
        self.running_since_probe: dict[int, int] = {}  # bucket -> calls named the running mode since its last probe
        self.backoff: dict[tuple[int, Mode], float] = {}  # probe interval factor (absent: 1)
        self.backoff_reference: dict[int, float] = {}  # chosen mode's cost when the bucket began backing off
        self.pairs: dict[int, deque[Pair]] = {}  # bucket -> recent probes' evidence, per kind
        self.probe: Probe | None = None
        self.calls_total = 0
        self.probe_calls_used = 0
        self.seconds_total = 0.0
        self.probe_extra_seconds = 0.0  # what ended probes took beyond the running mode's cost (net, >= 0)
        self.decisions: deque[Decision] = deque(maxlen=DECISION_LOG)
        self.next_decision_id = 1
        self.wall_clock = wall_clock  # stamps decisions (Decision.time)
        self.restored_extra: dict[str, Any] = {}  # what the control session saved with it (policy_state)

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
        """Share of calls that ran a mode other than the policy's choice (probes)."""
        return self.probe_calls_used / self.calls_total if self.calls_total else 0.0

    @property
    def probe_cost_share(self) -> float:
        """Seconds probes added, as a share of all seconds observed: what probe_budget bounds."""
        return self._charged_seconds() / self.seconds_total if self.seconds_total > 0 else 0.0

    def others(self, bucket: int) -> list[Mode]:
        return [m for m in self.modes if m != self.choice[bucket]]

    def probe_interval(self, bucket: int, mode: Mode) -> float:
        return self.params.probe_interval_seconds * self.backoff.get((bucket, mode), 1.0)

    @property
    def pairs_needed(self) -> int:
        """Probes of one kind whose median ratio alone settles a release (`auto` after a pin)."""
        return max(1, math.ceil(self.params.min_samples / self.params.probe_calls))

    def shares(self, bucket: int, now: float) -> dict[int, float]:
        """kind -> share of the bucket's time it takes: its recent calls x its cost under the running mode."""
        mix = self.mix.get(bucket)
        if mix is None or not mix.counts:
            return {}
        weights = {kind: calls * max(self._kind_cost(bucket, kind, now), 1e-9)
                   for kind, calls in mix.counts.items()}
        total = sum(weights.values())
        return {k: w / total for k, w in weights.items()}

    def _kind_cost(self, bucket: int, kind: int, now: float) -> float:
        """A call of this kind's cost in the bucket: under the running mode, else under the mode with the most
        fresh samples of it (a kind the running mode has not run lately still weighs what it costs, not what
        the bucket's other kinds cost), else the bucket's running median."""
        key = cell(bucket, kind)
        est = self.kind_estimates.get(key, self.choice[bucket], now)
        if est is None:
            found = [e for m in self.modes if (e := self.kind_estimates.get(key, m, now)) is not None]
            est = max(found, key=lambda e: e.samples) if found else self.estimates.get(bucket, self.choice[bucket], now)
        return est.value if est is not None else 1.0

    def paired_evidence(self, bucket: int, mode: Mode, now: float) -> Evidence | None:
        """What fresh pairs say about `mode` against the bucket's running mode for the bucket's traffic mix:
        probes of `mode` taken while the running mode ran, and probes of the running mode taken while `mode` ran
        (inverted: the evidence for switching back). Per kind, the newest 4 x pairs_needed count."""
        pairs = self.pairs.get(bucket)
        if not pairs:
            return None
        cutoff = now - self.params.max_sample_age_seconds
        while pairs and pairs[0].time < cutoff:
            pairs.popleft()
        running = self.choice[bucket]
        per_kind: dict[int, list[tuple[float, float, int]]] = {}
        for p in pairs:
            if (p.probed, p.reference) == (mode, running):
                per_kind.setdefault(p.kind, []).append((math.log(p.ratio), p.log_se, p.calls))
            elif (p.probed, p.reference) == (running, mode):
                per_kind.setdefault(p.kind, []).append((-math.log(p.ratio), p.log_se, p.calls))
        if not per_kind:
            return None
        keep = 4 * self.pairs_needed
        by_kind = {k: e for k, v in per_kind.items() if (e := combine_kind(v[-keep:])) is not None}
        shares = self.shares(bucket, now) or {k: 1.0 / len(by_kind) for k in by_kind}
        return combine_mix(by_kind, shares)

    def paired_ratio(self, bucket: int, mode: Mode, now: float) -> tuple[int, float] | None:
        """(probes, mix-weighted ratio) of `mode` against the running mode; see paired_evidence."""
        found = self.paired_evidence(bucket, mode, now)
        return None if found is None else (found.probes, found.ratio)

    # -- input ---------------------------------------------------------------------------------------------
    def observe(self, mode: Mode, bucket: int, seconds: float, now: float, tag: int = 0) -> bool:
        """One joined call of `bucket` that ran `mode`; `tag` says its kind and the mode its table named
        (gatherwise.call_kind; 0 when the engine does not say: then it counts as the mode that ran). True when
        it ended the running probe (the caller may step at once, so a probe costs no more calls than it needs,
        however long the loop waits between steps)."""
        if not math.isfinite(seconds) or seconds < 0:
            return False
        kind, table_mode = split_tag(tag)
        named = mode if table_mode is None or table_mode not in Mode._value2member_map_ else Mode(table_mode)
        self.estimates.add(bucket, mode, seconds, now)
        self.kind_estimates.add(cell(bucket, kind), named, seconds, now)
        mix = self.mix.get(bucket)
        if mix is None:
            mix = self.mix[bucket] = KindMix(self.params.window)
        mix.add(kind)
        arrivals = self.arrivals.get(bucket)
        if arrivals is None:
            arrivals = self.arrivals[bucket] = deque(maxlen=ARRIVALS_KEPT)
        arrivals.append(now)
        self.calls_total += 1
        self.seconds_total += seconds
        probe = self.probe
        if named == self.choice[bucket]:
            self.running_since_probe[bucket] = self.running_since_probe.get(bucket, 0) + 1
        elif bucket not in self.pins:
            self.probe_calls_used += 1
            extra = seconds - self._running_cost(bucket, kind, seconds, now)
            if probe is not None and probe.bucket == bucket and named == probe.mode:
                probe.extra += extra  # charged net when the probe ends: noise around an equal cost adds nothing
            else:
                self.probe_extra_seconds += max(0.0, extra)  # a call whose table had not caught up yet
        if probe is None or probe.bucket != bucket or named != probe.mode:
            return False
        probe.calls += 1
        if kind not in probe.references:
            probe.references[kind] = self.kind_estimates.recent(cell(bucket, kind), self.choice[bucket],
                                                                2 * self.params.probe_calls, before=probe.started)
        probe.samples.setdefault(kind, []).append(seconds)
        return (probe.calls >= self.params.probe_calls or self._over_budget()
                or (probe.calls >= MIN_PROBE_CALLS and self._probe_settled(probe)))

    def _running_cost(self, bucket: int, kind: int, fallback: float, now: float) -> float:
        """What the running mode costs a call of this kind now (its window median), for charging probes."""
        running = self.choice[bucket]
        est = self.kind_estimates.get(cell(bucket, kind), running, now) or self.estimates.get(bucket, running, now)
        return est.value if est is not None else fallback

    def _over_budget(self) -> bool:
        return self._charged_seconds() > self.params.probe_budget * self.seconds_total

    def _charged_seconds(self) -> float:
        """What probes added so far: ended probes' net extra, and the running probe's once it is positive."""
        return self.probe_extra_seconds + (max(0.0, self.probe.extra) if self.probe is not None else 0.0)

    def _end_probe(self) -> None:
        probe = self.probe
        if probe is not None:
            self.probe_extra_seconds += max(0.0, probe.extra)
            self.probe = None

    @staticmethod
    def _probe_settled(probe: Probe) -> bool:
        """Every kind the probe saw is decisive either way against its reference: more calls add nothing."""
        for kind, samples in probe.samples.items():
            found = pair_stats(samples, probe.references.get(kind, ()))
            if found is None or not decisive(math.log(found[0]), found[1]):
                return False
        return True

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
            found = self.paired_evidence(bucket, m, now)
            if found is not None:
                paired[m.label] = {"probes": found.probes, "calls": found.calls, "ratio": found.ratio,
                                   "log_se": found.log_se, "coverage": found.coverage,
                                   "kinds": {kind_label(k): {"probes": e.probes, "ratio": e.ratio}
                                             for k, e in sorted(found.by_kind.items())}}
        return {"bucket": bucket_label(bucket), "margin": self.params.margin,
                "min_samples": self.params.min_samples, "probes_needed": MIN_PROBES,
                "mix": {kind_label(k): round(v, 4) for k, v in sorted(self.shares(bucket, now).items())},
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
            self._end_probe()
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
            found = self.paired_evidence(b, pinned, now) if pinned != self.choice[b] else None
            if found is not None and found.ratio > 1.0 + self.params.margin and (
                    found.slower or found.probes >= self.pairs_needed):
                returned[bucket_label(b)] = self.choice[b].label  # fresh probes found the pin slower
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
        probe = self.probe
        if probe is not None and (probe.calls >= p.probe_calls or now - probe.started >= p.probe_timeout_seconds
                                  or self._over_budget() or self._quiet(probe.bucket, now)
                                  or (probe.calls >= MIN_PROBE_CALLS and self._probe_settled(probe))):
            self._end_probe()
            self.last_probe_end[probe.bucket] = now
            self.running_since_probe[probe.bucket] = 0
            backoff = self._after_probe(probe, now)
            out.append(self._decide("probe", self.choice[probe.bucket].label, [probe.bucket],
                                    {probe.bucket: probe.mode},
                                    {"phase": "end", "probe_calls": probe.calls, "backoff": backoff,
                                     **self.evidence(probe.bucket, now)}))
        for b in range(NUM_BUCKETS):
            if b in self.pins or (self.probe is not None and self.probe.bucket == b):
                continue
            active = self.choice[b]
            self._watch_load(b, self._running_estimate(b, now))
            if now - self.last_switch.get(b, -math.inf) < p.dwell_seconds:
                continue
            best = self._challenger(b, now)
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

    def _challenger(self, b: int, now: float) -> Mode | None:
        """The mode bucket b should switch to, if any: the lowest paired ratio that is decisively below 1 and
        below 1 - margin, from at least MIN_PROBES probes; or else, in a bucket whose calls are all of one
        kind, the lowest window median of that kind that beats the running mode's over the same period, among
        modes whose probes (if any) found them faster by the margin. Windows of a served engine's bucket mix
        batch sizes and step shapes that pairs compare alike: windows once adopted a mode whose three probes
        had found it 5 % slower."""
        p = self.params
        best, best_ratio = None, 1.0 - p.margin
        paired = {m: self.paired_evidence(b, m, now) for m in self.others(b)}
        for m, found in paired.items():
            if found is not None and found.probes >= MIN_PROBES and found.faster and found.ratio < best_ratio:
                best, best_ratio = m, found.ratio
        if best is not None:
            return best
        mix = self.mix.get(b)
        if mix is None or len(mix.counts) != 1:
            return None  # windows hold different kinds in different proportions: only pairs compare them
        key = cell(b, next(iter(mix.counts)))
        active_est = self.kind_estimates.get(key, self.choice[b], now)
        active_span = self.kind_estimates.span(key, self.choice[b])
        best_est = None
        for m in self.others(b):
            found = paired[m]
            if found is not None and found.ratio >= 1.0 - p.margin:
                continue  # pairs overrule windows: its probes did not find it faster than the running mode
            span = self.kind_estimates.span(key, m)
            if span is None or active_span is None or span[0] < active_span[0]:
                continue  # the other mode has samples from before the running mode's window: not the same period
            e = self.kind_estimates.get(key, m, now)
            if e is not None and e.samples >= p.min_samples and (best_est is None or e.value < best_est.value):
                best, best_est = m, e
        return best if best is not None and should_switch(active_est, best_est, p) else None

    # -- probes and their back-off -------------------------------------------------------------------------
    def _promising(self, bucket: int, mode: Mode, now: float) -> float | None:
        """The paired ratio of a mode whose probes so far beat the running one without settling it, else None."""
        found = self.paired_evidence(bucket, mode, now)
        if found is None or found.ratio >= 1.0 - self.params.margin or (found.probes >= MIN_PROBES and found.faster):
            return None
        return found.ratio

    def _record_pair(self, probe: Probe, now: float) -> float | None:
        """The probe's evidence, one pair per kind it saw; returns its mix-weighted ratio."""
        pairs = self.pairs.get(probe.bucket)
        if pairs is None:
            pairs = self.pairs[probe.bucket] = deque(maxlen=PAIRS_KEPT)
        reference = self.choice[probe.bucket]
        shares = self.shares(probe.bucket, now)
        weighted = covered = 0.0
        for kind, samples in sorted(probe.samples.items()):
            found = pair_stats(samples, probe.references.get(kind, ()))
            if found is None:
                continue
            pairs.append(Pair(now, probe.mode, reference, found[0], kind, found[1], len(samples)))
            share = shares.get(kind, 0.0)
            weighted += share * found[0]
            covered += share
        return weighted / covered if covered > 0 else None

    def _after_probe(self, probe: Probe, now: float) -> float:
        """Back off a mode the probe found far behind; reset one it found close. Returns the new factor."""
        key = (probe.bucket, probe.mode)
        ratio = self._record_pair(probe, now)
        chosen = self._running_estimate(probe.bucket, now)
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

    def _quiet(self, bucket: int, now: float) -> bool:
        """No call of the bucket for 4x its recent gap between calls (at least a second): its traffic stopped, so
        a probe there would wait instead of measuring (and hold up every other bucket's probes)."""
        times = self.arrivals.get(bucket)
        if not times:
            return True
        gap = self._mean_gap(bucket)
        return now - times[-1] > max(QUIET_SECONDS, 4.0 * (QUIET_SECONDS if gap is None else gap))

    def _mean_gap(self, bucket: int) -> float | None:
        """Mean seconds between the bucket's recent calls (None before two)."""
        times = self.arrivals.get(bucket)
        return (times[-1] - times[0]) / (len(times) - 1) if times and len(times) > 1 else None

    def _time_share(self, bucket: int, now: float) -> float:
        """Seconds per second the bucket's calls take lately: its call rate x its running cost, rounded to a
        coarse scale (1.5^k) so that noise between buckets of about the same weight does not reorder them."""
        gap, active = self._mean_gap(bucket), self._running_estimate(bucket, now)
        if not gap or active is None or active.value <= 0:
            return 0.0
        return 1.5 ** round(math.log(active.value / gap, 1.5))

    def _fresh_reference(self, bucket: int) -> bool:
        """The running mode ran enough calls since the bucket's last probe for a new probe to compare with."""
        return bucket not in self.last_probe_end or self.running_since_probe.get(bucket, 0) >= MIN_PROBE_CALLS

    def _running_estimate(self, bucket: int, now: float) -> Estimate | None:
        """The running mode's cost in the bucket, for watching the load: its window of the bucket's most frequent
        kind, by the mode the calls' tables named (a table whose calls all step aside has no window of its own
        mode among the modes that ran)."""
        mix = self.mix.get(bucket)
        if mix is None or not mix.counts:
            return self.estimates.get(bucket, self.choice[bucket], now)
        kind = max(mix.counts, key=mix.counts.__getitem__)
        return self.kind_estimates.get(cell(bucket, kind), self.choice[bucket], now)

    def _maybe_probe(self, now: float) -> Decision | None:
        p = self.params
        if p.probe_budget <= 0 or self._over_budget():
            return None
        candidates = []
        for b in range(NUM_BUCKETS):
            if b in self.pins:
                continue
            newest_active = self.estimates.newest(b, self.choice[b])
            if newest_active is None or self._quiet(b, now):
                continue  # no traffic in this bucket right now: a probe would measure nothing
            weight = -self._time_share(b, now)
            for m in self.others(b):
                promising = self._promising(b, m, now)
                if promising is not None:  # confirm it as soon as there is a fresh reference to compare with
                    if not self._fresh_reference(b):
                        continue
                    candidates.append((weight, 0, promising, b, int(m)))
                    continue
                if now - self.last_probe.get((b, m), -math.inf) < self.probe_interval(b, m):
                    continue
                newest_other = self.estimates.newest(b, m)
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
        return self._decide("probe", mode.label, [b], {b: self.choice[b]},
                            {"phase": "start", "probe_calls": p.probe_calls, "probe_share": self.probe_share,
                             "probe_cost_share": self.probe_cost_share,
                             "backoff": self.backoff.get((b, mode), 1.0), **self.evidence(b, now)})

    def set_params(self, params: PolicyParams) -> None:
        self.params = params
        self.estimates.resize(params.window, params.max_sample_age_seconds)
        self.kind_estimates.resize(params.window, params.max_sample_age_seconds)
        self.mix = {b: KindMix(params.window, v.kinds) for b, v in self.mix.items()}
