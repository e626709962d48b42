"""The auto choice: the mode each bucket runs when no pin is set, decided from paired evidence. Pure, no I/O.

Compare modes on costs measured at the same time, never on windows from different periods: the running mode of
a busy bucket fills its window in a second or two while another mode is only measured by probes spread over
minutes, and on a shared host the load moves the costs of both by more than the differences the policy looks
for (comparing such windows made it switch back and forth on drift alone). So every probe yields paired
evidence (sidecar.policy.paired_evidence): per call kind, the probed mode's median over the probe against the running
mode's median just before it. A bucket's ratio for a mode weights each kind by the share of the bucket's time it
takes. A bucket switches to the mode whose mix-weighted ratio is below 1 - `margin` and below 1 by Z standard
errors, from at least MIN_PROBES probes. Probes of the running mode taken while another mode ran count too,
inverted, so the evidence that made a bucket switch is the evidence against switching back. Windows are
compared directly only when the bucket's calls are all of one kind and the other mode's samples all fall within
the running mode's window, with `min_samples` on both sides. A bucket never switches twice within
`dwell_seconds`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from gatherwise.call_kind import kind_label
from gatherwise.config import PolicyParams
from gatherwise.modes import Mode, ModeTable, bucket_label
from gatherwise.sidecar.policy.bucket_traffic import BucketTraffic, cell
from gatherwise.sidecar.policy.estimates import Estimate
from gatherwise.sidecar.policy.paired_evidence import Evidence, Pair, combine_kind, combine_mix, pair_stats

PAIRS_KEPT = 64  # paired ratios kept per bucket
MIN_PROBES = 2  # probes behind a switch: one probe can coincide with a load step between it and its reference


def should_switch(active: Estimate | None, challenger: Estimate | None, params: PolicyParams) -> bool:
    """True when the challenger is faster by the margin, with enough samples on both sides."""
    if active is None or challenger is None:
        return False
    if min(active.samples, challenger.samples) < params.min_samples:
        return False
    return challenger.value < active.value * (1.0 - params.margin)


class AutoChoice:
    """The policy's mode per bucket (probes and pins aside), the paired evidence it is chosen from, and when
    each bucket last switched."""

    def __init__(self, params: PolicyParams, modes: Sequence[Mode], table: ModeTable,
                 traffic: BucketTraffic) -> None:
        self.params = params
        self.modes = tuple(modes)
        self.traffic = traffic
        self.choice: list[Mode] = list(table.modes)
        self.last_switch: dict[int, float] = {}
        self.pairs: dict[int, deque[Pair]] = {}  # bucket -> recent probes' evidence, per kind

    def others(self, bucket: int) -> list[Mode]:
        return [m for m in self.modes if m != self.choice[bucket]]

    @property
    def pairs_needed(self) -> int:
        """Probes of one kind whose median ratio alone settles a release (`auto` after a pin)."""
        return max(1, math.ceil(self.params.min_samples / self.params.probe_calls))

    def shares(self, bucket: int, now: float) -> dict[int, float]:
        """kind -> share of the bucket's time it takes under the mode it runs now."""
        return self.traffic.shares(bucket, self.choice[bucket], now)

    # -- evidence ------------------------------------------------------------------------------------------
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

    def promising(self, bucket: int, mode: Mode, now: float) -> float | None:
        """The paired ratio of a mode whose probes so far beat the running one without settling it, else None."""
        found = self.paired_evidence(bucket, mode, now)
        if found is None or found.ratio >= 1.0 - self.params.margin or (found.probes >= MIN_PROBES and found.faster):
            return None
        return found.ratio

    def record_probe(self, bucket: int, probed: Mode, samples: Mapping[int, list[float]],
                     references: Mapping[int, list[float]], now: float) -> float | None:
        """A finished probe's evidence, one pair per kind it saw (`samples`: kind -> its calls' seconds;
        `references`: kind -> the running mode's just before it); returns its mix-weighted ratio."""
        pairs = self.pairs.get(bucket)
        if pairs is None:
            pairs = self.pairs[bucket] = deque(maxlen=PAIRS_KEPT)
        reference = self.choice[bucket]
        shares = self.shares(bucket, now)
        weighted = covered = 0.0
        for kind, probe_samples in sorted(samples.items()):
            found = pair_stats(probe_samples, references.get(kind, ()))
            if found is None:
                continue
            pairs.append(Pair(now, probed, reference, found[0], kind, found[1], len(probe_samples)))
            share = shares.get(kind, 0.0)
            weighted += share * found[0]
            covered += share
        return weighted / covered if covered > 0 else None

    def evidence(self, bucket: int, now: float) -> dict[str, Any]:
        """What a decision about the bucket logs as its evidence (GET /v1/decisions)."""
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
                "estimates": {m.label: asdict(e) if (e := self.traffic.estimates.get(bucket, m, now)) else None
                              for m in self.modes},
                "paired": paired}

    # -- choosing ------------------------------------------------------------------------------------------
    def dwelling(self, bucket: int, now: float) -> bool:
        """The bucket switched less than `dwell_seconds` ago: it may not switch again yet."""
        return now - self.last_switch.get(bucket, -math.inf) < self.params.dwell_seconds

    def switch(self, bucket: int, mode: Mode, now: float) -> None:
        self.choice[bucket] = mode
        self.last_switch[bucket] = now

    def challenger(self, b: int, now: float) -> Mode | None:
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
        mix = self.traffic.mix.get(b)
        if mix is None or len(mix.counts) != 1:
            return None  # windows hold different kinds in different proportions: only pairs compare them
        windows = self.traffic.kind_estimates
        key = cell(b, next(iter(mix.counts)))
        active_est = windows.get(key, self.choice[b], now)
        active_span = windows.span(key, self.choice[b])
        best_est = None
        for m in self.others(b):
            found = paired[m]
            if found is not None and found.ratio >= 1.0 - p.margin:
                continue  # pairs overrule windows: its probes did not find it faster than the running mode
            span = windows.span(key, m)
            if span is None or active_span is None or span[0] < active_span[0]:
                continue  # the other mode has samples from before the running mode's window: not the same period
            e = windows.get(key, m, now)
            if e is not None and e.samples >= p.min_samples and (best_est is None or e.value < best_est.value):
                best, best_est = m, e
        return best if best is not None and should_switch(active_est, best_est, p) else None
