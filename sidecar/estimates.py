"""Windowed, robust per-bucket x mode estimates of the cross-rank critical path (DESIGN §8). Pure, no I/O.

Each (bucket, mode) keeps its last `window` samples, each with the monotonic time it was observed. Samples
older than `max_age` seconds drop out, so a mode that only gets probed (a few calls now and then) is judged on
recent probes, not on what it cost before the load changed. The estimate the policy compares is the median:
gloo collectives on a shared CPU have p90 several times their median, and a mean would chase those outliers.
A summary is computed when its window changed and cached otherwise: the control loop and every scrape ask for
every (bucket, mode), and sorting the windows each time cost the sidecar several % of a core when idle.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from dataclasses import dataclass

from engine_hooks.modes import Mode


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
    """Samples per (bucket, mode), for any mode code the rings report (windows are created on first use)."""

    def __init__(self, window: int, max_age_seconds: float) -> None:
        self.window, self.max_age = window, max_age_seconds
        self._samples: dict[tuple[int, Mode], deque[tuple[float, float]]] = {}
        self._cache: dict[tuple[int, Mode], tuple[int, Estimate]] = {}  # key -> (version, summary)
        self._version: dict[tuple[int, Mode], int] = {}  # bumped on every change of a window

    def add(self, bucket: int, mode: Mode, seconds: float, now: float) -> None:
        key = (bucket, mode)
        samples = self._samples.get(key)
        if samples is None:
            samples = self._samples[key] = deque(maxlen=self.window)
        samples.append((now, seconds))
        self._version[key] = self._version.get(key, 0) + 1

    def get(self, bucket: int, mode: Mode, now: float) -> Estimate | None:
        """The estimate from the samples still inside the window and younger than max_age; None if none."""
        key = (bucket, mode)
        samples = self._samples.get(key)
        if not samples:
            return None
        cutoff = now - self.max_age
        if samples[0][0] < cutoff:
            while samples and samples[0][0] < cutoff:
                samples.popleft()
            self._version[key] = self._version.get(key, 0) + 1
            if not samples:
                return None
        version = self._version.get(key, 0)
        age = max(0.0, now - samples[-1][0])
        cached = self._cache.get(key)
        if cached is not None and cached[0] == version:
            est = cached[1]
            return est if est.age_seconds == age else dataclasses.replace(est, age_seconds=age)
        est = summarize([s for _, s in samples], age)
        self._cache[key] = (version, est)
        return est

    def newest(self, bucket: int, mode: Mode) -> float | None:
        """Monotonic time of the newest sample (before pruning), or None."""
        samples = self._samples.get((bucket, mode))
        return samples[-1][0] if samples else None

    def resize(self, window: int, max_age_seconds: float) -> None:
        """Apply new policy parameters, keeping the newest samples."""
        self.window, self.max_age = window, max_age_seconds
        self._samples = {k: deque(v, maxlen=window) for k, v in self._samples.items()}
        self._cache.clear()

    # -- durable state (the sidecar-state.json file) -------------------------------------------------------
    def to_json(self) -> dict[str, list[list[float]]]:
        return {f"{b}:{m.label}": [list(s) for s in v] for (b, m), v in sorted(self._samples.items()) if v}

    def load_json(self, data: dict[str, list[list[float]]]) -> None:
        for key, values in data.items():
            bucket, label = key.split(":")
            key = (int(bucket), Mode.parse(label))
            self._samples[key] = deque(((float(t), float(s)) for t, s in values), maxlen=self.window)
            self._version[key] = self._version.get(key, 0) + 1
