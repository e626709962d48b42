"""The auto policy (DESIGN §8): per bucket, pick the mode with the lower critical path; pins override it.

Pure decision logic, no I/O and no clock of its own: the controller feeds it samples (`observe`) and the time
(`step(now)`), and writes whatever `desired_table()` says into the control block. Rules:
- switch an auto bucket when the other mode's median is lower by `margin` (fraction), both sides have at least
  `min_samples` recent samples, and the bucket has not switched for `dwell_seconds` (hysteresis);
- keep the losing mode's estimate fresh by probes: one bucket at a time runs the other mode for `probe_calls`
  calls, at most every `probe_interval_seconds` per bucket, and only while probe calls stay within
  `probe_budget` of all calls seen (calls that ran a mode other than the policy's choice count as probe calls);
- a pinned bucket (manual `PUT /v1/mode gather|all_gather`) is never touched; `auto` releases the pin.
Every decision is returned with its evidence, and kept in a bounded log.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine_hooks.modes import NUM_BUCKETS, Mode, ModeTable, bucket_label, bucket_of
from sidecar.estimates import Estimate, WindowEstimates

DECISION_LOG = 256
REASONS = ("manual", "auto", "probe", "table_file")


@dataclass(frozen=True)
class PolicyParams:
    margin: float = 0.05
    min_samples: int = 30
    window: int = 256
    dwell_seconds: float = 5.0
    probe_interval_seconds: float = 10.0
    probe_calls: int = 8
    probe_budget: float = 0.02
    max_sample_age_seconds: float = 120.0

    @classmethod
    def from_config(cls, section: Any) -> PolicyParams:
        return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls)})

    @property
    def probe_timeout_seconds(self) -> float:
        """A probe of a bucket whose traffic stopped ends after this long anyway."""
        return max(2.0, 2.0 * self.probe_interval_seconds)


@dataclass
class Decision:
    id: int
    time: float  # the controller's wall clock (unix seconds)
    reason: str  # one of REASONS
    mode: str  # the mode the buckets go to
    buckets: list[str]  # bucket labels ("1", "2", "4", ...)
    previous: dict[str, str]  # bucket label -> mode before
    evidence: dict[str, Any] = field(default_factory=dict)
    command_seq: int | None = None  # set by the controller once written to the control block


@dataclass
class Probe:
    bucket: int
    mode: Mode
    started: float
    calls: int = 0


def other(mode: Mode) -> Mode:
    return Mode.GATHER if mode == Mode.ALL_GATHER else Mode.ALL_GATHER


def estimate_json(est: Estimate | None) -> dict[str, Any] | None:
    if est is None:
        return None
    return {"samples": est.samples, "p50": est.p50, "mean": est.mean, "p90": est.p90, "age_seconds": est.age_seconds}


def should_switch(active: Estimate | None, challenger: Estimate | None, params: PolicyParams) -> bool:
    """True when the challenger is faster by the margin, with enough samples on both sides."""
    if active is None or challenger is None:
        return False
    if min(active.samples, challenger.samples) < params.min_samples:
        return False
    return challenger.value < active.value * (1.0 - params.margin)


class AutoPolicy:
    def __init__(self, params: PolicyParams, table: ModeTable, *, auto: bool) -> None:
        self.params = params
        self.choice: list[Mode] = list(table.modes)  # the policy's mode per bucket (probes aside)
        self.pins: dict[int, Mode] = {} if auto else dict(enumerate(table.modes))
        self.estimates = WindowEstimates(params.window, params.max_sample_age_seconds)
        self.last_switch: dict[int, float] = {}
        self.last_probe: dict[int, float] = {}
        self.probe: Probe | None = None
        self.calls_total = 0
        self.probe_calls_used = 0
        self.decisions: deque[Decision] = deque(maxlen=DECISION_LOG)
        self.next_decision_id = 1
        self.clock_wall = 0.0  # set by the controller before each call that can decide
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

    # -- input ---------------------------------------------------------------------------------------------
    def observe(self, mode: Mode, rows: int, seconds: float, now: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        bucket = bucket_of(rows)
        self.estimates.add(bucket, mode, seconds, now)
        self.calls_total += 1
        if bucket not in self.pins and mode != self.choice[bucket]:
            self.probe_calls_used += 1
        if self.probe is not None and self.probe.bucket == bucket and mode == self.probe.mode:
            self.probe.calls += 1

    # -- decisions -----------------------------------------------------------------------------------------
    def _decide(self, reason: str, mode: Mode, buckets: Iterable[int], previous: dict[int, Mode],
                evidence: dict[str, Any]) -> Decision:
        labels = [bucket_label(b) for b in buckets]
        decision = Decision(self.next_decision_id, self.clock_wall, reason, mode.label, labels,
                            {bucket_label(b): m.label for b, m in previous.items()}, evidence)
        self.next_decision_id += 1
        self.decisions.append(decision)
        return decision

    def evidence(self, bucket: int, now: float) -> dict[str, Any]:
        return {"bucket": bucket_label(bucket), "margin": self.params.margin,
                "min_samples": self.params.min_samples,
                "estimates": {m.label: estimate_json(self.estimates.get(bucket, m, now))
                              for m in (Mode.ALL_GATHER, Mode.GATHER)}}

    def pin(self, mode: Mode, buckets: list[int] | None, now: float) -> Decision:
        chosen = list(range(NUM_BUCKETS)) if buckets is None else sorted(set(buckets))
        current = self.desired_table()
        previous = {b: current.modes[b] for b in chosen}
        for b in chosen:
            self.pins[b] = mode
        if self.probe is not None and self.probe.bucket in self.pins:
            self.probe = None
        return self._decide("manual", mode, chosen, previous, {"pinned": [bucket_label(b) for b in chosen]})

    def release(self, buckets: list[int] | None, now: float) -> Decision:
        """`auto` for these buckets: drop their pins; the policy continues from the mode they run now."""
        chosen = list(range(NUM_BUCKETS)) if buckets is None else sorted(set(buckets))
        previous = {}
        for b in chosen:
            if b in self.pins:
                self.choice[b] = previous[b] = self.pins.pop(b)
        decision = self._decide("manual", Mode.ALL_GATHER, chosen, previous,
                                {"released": [bucket_label(b) for b in chosen]})
        decision.mode = "auto"
        return decision

    def adopt_table(self, table: ModeTable, now: float, source: str) -> Decision | None:
        """Start auto buckets from a learned table (policy.table_file)."""
        changed = [b for b in range(NUM_BUCKETS) if b not in self.pins and self.choice[b] != table.modes[b]]
        decision = None
        for mode in (Mode.ALL_GATHER, Mode.GATHER):
            bs = [b for b in changed if table.modes[b] == mode]
            if bs:
                previous = {b: self.choice[b] for b in bs}
                for b in bs:
                    self.choice[b] = mode
                decision = self._decide("table_file", mode, bs, previous, {"source": source})
        return decision

    def step(self, now: float) -> list[Decision]:
        """End a finished probe, switch buckets whose evidence says so, maybe start a probe."""
        out: list[Decision] = []
        p = self.params
        if self.probe is not None and (self.probe.calls >= p.probe_calls
                                       or now - self.probe.started >= p.probe_timeout_seconds):
            probe, self.probe = self.probe, None
            out.append(self._decide("probe", self.choice[probe.bucket], [probe.bucket], {probe.bucket: probe.mode},
                                    {"phase": "end", "probe_calls": probe.calls, **self.evidence(probe.bucket, now)}))
        for b in range(NUM_BUCKETS):
            if b in self.pins or (self.probe is not None and self.probe.bucket == b):
                continue
            if now - self.last_switch.get(b, -math.inf) < p.dwell_seconds:
                continue
            active, challenger = self.choice[b], other(self.choice[b])
            if should_switch(self.estimates.get(b, active, now), self.estimates.get(b, challenger, now), p):
                self.choice[b] = challenger
                self.last_switch[b] = now
                out.append(self._decide("auto", challenger, [b], {b: active}, self.evidence(b, now)))
        if self.probe is None:
            started = self._maybe_probe(now)
            if started is not None:
                out.append(started)
        return out

    def _maybe_probe(self, now: float) -> Decision | None:
        p = self.params
        if p.probe_budget <= 0 or self.probe_calls_used + p.probe_calls > p.probe_budget * self.calls_total:
            return None
        candidates = []
        for b in range(NUM_BUCKETS):
            if b in self.pins or now - self.last_probe.get(b, -math.inf) < p.probe_interval_seconds:
                continue
            newest_active = self.estimates.newest(b, self.choice[b])
            if newest_active is None or now - newest_active > p.probe_timeout_seconds:
                continue  # no traffic in this bucket right now: a probe would measure nothing
            newest_other = self.estimates.newest(b, other(self.choice[b]))
            candidates.append((-math.inf if newest_other is None else newest_other, b))
        if not candidates:
            return None
        _, b = min(candidates)  # the bucket whose other mode was measured longest ago
        mode = other(self.choice[b])
        self.probe = Probe(b, mode, now)
        self.last_probe[b] = now
        return self._decide("probe", mode, [b], {b: self.choice[b]},
                            {"phase": "start", "probe_calls": p.probe_calls, "probe_share": self.probe_share,
                             **self.evidence(b, now)})

    def set_params(self, params: PolicyParams) -> None:
        self.params = params
        self.estimates.resize(params.window, params.max_sample_age_seconds)
