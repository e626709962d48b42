"""Windowed, robust per-bucket x mode estimates of the cross-rank critical path (DESIGN §8). Pure, no I/O.

Each (bucket, mode) keeps its last `window` samples, each with the monotonic time it was observed. Samples
older than `max_age` seconds drop out, so a mode that only gets probed (a few calls now and then) is judged on
recent probes, not on what it cost before the load changed. The estimate the policy compares is the median:
gloo collectives on a shared CPU have p90 several times their median, and a mean would chase those outliers.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from engine_hooks.modes import IMPLEMENTED, NUM_BUCKETS, Mode


@dataclass(frozen=True)
class Estimate:
    samples: int
    mean: float  # seconds
    p50: float  # seconds: the robust estimate the policy compares
    p90: float
    age_seconds: float  # since the newest sample

    @property
    def value(self) -> float:
        return self.p50


def summarize(values: list[float], age_seconds: float) -> Estimate:
    ordered = sorted(values)
    n = len(ordered)
    return Estimate(n, statistics.fmean(ordered), _quantile(ordered, 0.5), _quantile(ordered, 0.9), age_seconds)


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on a sorted list."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class WindowEstimates:
    def __init__(self, window: int, max_age_seconds: float) -> None:
        self.window, self.max_age = window, max_age_seconds
        self._samples: dict[tuple[int, Mode], deque[tuple[float, float]]] = {
            (b, m): deque(maxlen=window) for b in range(NUM_BUCKETS) for m in IMPLEMENTED}

    def add(self, bucket: int, mode: Mode, seconds: float, now: float) -> None:
        self._samples[(bucket, mode)].append((now, seconds))

    def get(self, bucket: int, mode: Mode, now: float) -> Estimate | None:
        """The estimate from the samples still inside the window and younger than max_age; None if none."""
        samples = self._samples[(bucket, mode)]
        cutoff = now - self.max_age
        while samples and samples[0][0] < cutoff:
            samples.popleft()
        if not samples:
            return None
        return summarize([s for _, s in samples], max(0.0, now - samples[-1][0]))

    def newest(self, bucket: int, mode: Mode) -> float | None:
        """Monotonic time of the newest sample (before pruning), or None."""
        samples = self._samples[(bucket, mode)]
        return samples[-1][0] if samples else None

    def resize(self, window: int, max_age_seconds: float) -> None:
        """Apply new policy parameters, keeping the newest samples."""
        self.window, self.max_age = window, max_age_seconds
        self._samples = {k: deque(v, maxlen=window) for k, v in self._samples.items()}

    # -- durable state (the sidecar-state.json file) -------------------------------------------------------
    def to_json(self) -> dict[str, list[list[float]]]:
        return {f"{b}:{m.label}": [list(s) for s in v] for (b, m), v in self._samples.items() if v}

    def load_json(self, data: dict[str, list[list[float]]]) -> None:
        for key, values in data.items():
            bucket, label = key.split(":")
            dq = self._samples[(int(bucket), Mode.parse(label))]
            dq.clear()
            dq.extend((float(t), float(s)) for t, s in values)
