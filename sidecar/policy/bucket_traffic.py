"""What each bucket's calls measured: their cost windows (by the mode that ran, and by call kind and the mode
their table named), the kinds of its recent calls and when they arrived. Pure, no I/O.

Both the auto choice and the probes read these; neither owns them. Every question takes the bucket's running
mode as an argument, so the same measurements answer for whatever mode the policy runs there now.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from gatherwise.call_kind import KINDS
from gatherwise.config import PolicyParams
from gatherwise.modes import Mode
from gatherwise.sidecar.policy.estimates import Estimate, KindMix, WindowEstimates

ARRIVALS_KEPT = 16  # call times kept per bucket, for its recent gap between calls
QUIET_SECONDS = 1.0  # a bucket without calls for this long (or 4 gaps) is not probed


def cell(bucket: int, kind: int) -> int:
    """The key of a (bucket, call kind) sample window."""
    return bucket * KINDS + kind


class BucketTraffic:
    """Cost windows, kind mix and arrival times per bucket."""

    def __init__(self, params: PolicyParams, modes: Sequence[Mode]) -> None:
        self.modes = tuple(modes)
        self.window = params.window
        self.estimates = WindowEstimates(params.window, params.max_sample_age_seconds)  # by the mode that ran
        # by (bucket, kind) cell and the mode the call's table named: what pairs and probe costs compare
        self.kind_estimates = WindowEstimates(params.window, params.max_sample_age_seconds)
        self.mix: dict[int, KindMix] = {}  # bucket -> kinds of its newest `window` calls
        self.arrivals: dict[int, deque[float]] = {}  # bucket -> times of its newest calls

    def add(self, bucket: int, ran: Mode, named: Mode, kind: int, seconds: float, now: float) -> None:
        """One call of the bucket: `ran` is the mode that ran it, `named` the mode its table named."""
        self.estimates.add(bucket, ran, seconds, now)
        self.kind_estimates.add(cell(bucket, kind), named, seconds, now)
        mix = self.mix.get(bucket)
        if mix is None:
            mix = self.mix[bucket] = KindMix(self.window)
        mix.add(kind)
        arrivals = self.arrivals.get(bucket)
        if arrivals is None:
            arrivals = self.arrivals[bucket] = deque(maxlen=ARRIVALS_KEPT)
        arrivals.append(now)

    def resize(self, params: PolicyParams) -> None:
        """Apply new parameters, keeping the newest samples and kinds."""
        self.window = params.window
        self.estimates.resize(params.window, params.max_sample_age_seconds)
        self.kind_estimates.resize(params.window, params.max_sample_age_seconds)
        self.mix = {b: KindMix(params.window, v.kinds) for b, v in self.mix.items()}

    # -- costs ---------------------------------------------------------------------------------------------
    def shares(self, bucket: int, running: Mode, now: float) -> dict[int, float]:
        """kind -> share of the bucket's time it takes: its recent calls x its cost under the running mode."""
        mix = self.mix.get(bucket)
        if mix is None or not mix.counts:
            return {}
        weights = {kind: calls * max(self.kind_cost(bucket, kind, running, now), 1e-9)
                   for kind, calls in mix.counts.items()}
        total = sum(weights.values())
        return {k: w / total for k, w in weights.items()}

    def kind_cost(self, bucket: int, kind: int, running: Mode, now: float) -> float:
        """A call of this kind's cost in the bucket: under the running mode, else under the mode with the most
        fresh samples of it (a kind the running mode has not run lately still weighs what it costs, not what
        the bucket's other kinds cost), else the bucket's running median."""
        key = cell(bucket, kind)
        est = self.kind_estimates.get(key, running, now)
        if est is None:
            found = [e for m in self.modes if (e := self.kind_estimates.get(key, m, now)) is not None]
            est = max(found, key=lambda e: e.samples) if found else self.estimates.get(bucket, running, now)
        return est.value if est is not None else 1.0

    def running_cost(self, bucket: int, kind: int, running: Mode, fallback: float, now: float) -> float:
        """What the running mode costs a call of this kind now (its window median), for charging probes."""
        est = self.kind_estimates.get(cell(bucket, kind), running, now) or self.estimates.get(bucket, running, now)
        return est.value if est is not None else fallback

    def running_estimate(self, bucket: int, running: Mode, now: float) -> Estimate | None:
        """The running mode's cost in the bucket, for watching the load: its window of the bucket's most frequent
        kind, by the mode the calls' tables named (a table whose calls all step aside has no window of its own
        mode among the modes that ran)."""
        mix = self.mix.get(bucket)
        if mix is None or not mix.counts:
            return self.estimates.get(bucket, running, now)
        kind = max(mix.counts, key=mix.counts.__getitem__)
        return self.kind_estimates.get(cell(bucket, kind), running, now)

    # -- traffic -------------------------------------------------------------------------------------------
    def quiet(self, bucket: int, now: float) -> bool:
        """No call of the bucket for 4x its recent gap between calls (at least a second): its traffic stopped, so
        a probe there would wait instead of measuring (and hold up every other bucket's probes)."""
        times = self.arrivals.get(bucket)
        if not times:
            return True
        gap = self.mean_gap(bucket)
        return now - times[-1] > max(QUIET_SECONDS, 4.0 * (QUIET_SECONDS if gap is None else gap))

    def mean_gap(self, bucket: int) -> float | None:
        """Mean seconds between the bucket's recent calls (None before two)."""
        times = self.arrivals.get(bucket)
        return (times[-1] - times[0]) / (len(times) - 1) if times and len(times) > 1 else None

    def time_share(self, bucket: int, running: Mode, now: float) -> float:
        """Seconds per second the bucket's calls take lately: its call rate x its running cost, rounded to a
        coarse scale (1.5^k) so that noise between buckets of about the same weight does not reorder them."""
        gap, active = self.mean_gap(bucket), self.running_estimate(bucket, running, now)
        if not gap or active is None or active.value <= 0:
            return 0.0
        return 1.5 ** round(math.log(active.value / gap, 1.5))
