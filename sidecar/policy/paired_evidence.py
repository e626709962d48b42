"""Paired evidence for the auto policy: how much faster or slower one mode is than another, per call kind, and
how sure that is. Pure arithmetic, no I/O.

A probe runs a mode on a bucket for a few calls; each call kind (gatherwise.call_kind) it saw yields one Pair:
the log of (median cost of the probe's calls of that kind / median cost of the running mode's calls of that
kind just before the probe), with its standard error from the spread of both samples. Kinds are never mixed in
a ratio: a greedy call and a top-p call differ by far more than any two modes do.

Pairs of one (bucket, kind) combine by inverse-variance weighting into that kind's log-ratio; a bucket's ratio
for a mode is the kinds' ratios weighted by the share of the bucket's time each kind takes (its calls x its
cost under the running mode), so the policy chooses for the traffic mix the bucket actually sees. Decisions
are sequential: evidence is decisive once the ratio clears 1 by Z standard errors, however few calls that
took, so a mode 1.5x faster is adopted after a couple of short probes and a 10 % difference after a few more.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gatherwise.modes import Mode

Z = 2.5  # standard errors between a decisive ratio and 1
MIN_CALLS = 3  # on each side before a pair's spread says anything
SIGMA_FLOOR = 0.03  # log-cost spread assumed at least (identical samples are not certainty)
SIGMA_PRIOR = 0.5  # log-cost spread of a sample too small to measure its own
COVERAGE = 0.9  # share of the bucket's time the kinds with evidence must cover before a bucket decides
_MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)  # se of a median / se of a mean, normal samples
_MAD_TO_SIGMA = 1.4826


class Pair(NamedTuple):
    """One probe's evidence for one call kind: log(probed median / reference median) and its standard error,
    both modes measured under the same load, `calls` probe calls behind it."""

    time: float
    probed: Mode
    reference: Mode
    ratio: float
    kind: int = 0
    log_se: float = SIGMA_PRIOR
    calls: int = 0


def _spread(logs: Sequence[float], centre: float) -> float:
    return _MAD_TO_SIGMA * statistics.median(abs(x - centre) for x in logs)


def pair_stats(probed: Sequence[float], reference: Sequence[float]) -> tuple[float, float] | None:
    """(ratio of medians, standard error of its log) of two samples of costs (seconds), or None when either
    is empty or holds a non-positive cost."""
    if not probed or not reference or min(probed) <= 0 or min(reference) <= 0:
        return None
    lp, lr = [math.log(x) for x in probed], [math.log(x) for x in reference]
    mp, mr = statistics.median(lp), statistics.median(lr)
    if len(lp) >= MIN_CALLS and len(lr) >= MIN_CALLS:
        sigma = max(_spread(lp, mp), _spread(lr, mr), SIGMA_FLOOR)
    else:
        sigma = SIGMA_PRIOR
    se = _MEDIAN_EFFICIENCY * sigma * math.sqrt(1.0 / len(lp) + 1.0 / len(lr))
    return math.exp(mp - mr), se


def decisive(log_ratio: float, log_se: float) -> bool:
    return abs(log_ratio) > Z * log_se


@dataclass(frozen=True)
class KindEvidence:
    probes: int
    calls: int
    ratio: float
    log_se: float


@dataclass(frozen=True)
class Evidence:
    """What the pairs say about `mode` against the running mode of one bucket, for its traffic mix."""

    probes: int  # probes behind the kind with the fewest, among the kinds that carry weight
    calls: int
    ratio: float  # mix-weighted cost of `mode` / cost of the running mode
    log_se: float
    coverage: float  # share of the bucket's time in kinds that have evidence
    by_kind: dict[int, KindEvidence]

    @property
    def faster(self) -> bool:
        """Decisively faster, for the whole mix."""
        return self.coverage >= COVERAGE and math.log(self.ratio) + Z * self.log_se < 0.0

    @property
    def slower(self) -> bool:
        return self.coverage >= COVERAGE and math.log(self.ratio) - Z * self.log_se > 0.0


def combine_kind(pairs: Iterable[tuple[float, float, int]]) -> KindEvidence | None:
    """Inverse-variance mean of (log ratio, se, calls) pairs of one kind."""
    weight = total = 0.0
    probes = calls = 0
    for log_ratio, se, n in pairs:
        w = 1.0 / max(se, 1e-6) ** 2
        weight += w
        total += w * log_ratio
        probes += 1
        calls += n
    if not probes:
        return None
    return KindEvidence(probes, calls, math.exp(total / weight), 1.0 / math.sqrt(weight))


def combine_mix(by_kind: Mapping[int, KindEvidence], shares: Mapping[int, float]) -> Evidence | None:
    """A bucket's evidence from its kinds' (shares: kind -> share of the bucket's time, summing to 1). Kinds
    without evidence leave the ratio to the others and lower `coverage`."""
    covered = {k: e for k, e in by_kind.items() if shares.get(k, 0.0) > 0.0}
    if not covered:
        return None
    coverage = sum(shares[k] for k in covered)
    weighted = sum(shares[k] * e.ratio for k, e in covered.items())
    ratio = weighted / coverage
    variance = sum((shares[k] * e.ratio * e.log_se) ** 2 for k, e in covered.items())
    log_se = math.sqrt(variance) / weighted
    heavy = [e.probes for k, e in covered.items() if shares[k] >= 1.0 - COVERAGE] or [0]
    return Evidence(min(heavy), sum(e.calls for e in covered.values()), ratio, log_se, coverage, dict(covered))
