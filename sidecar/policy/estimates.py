"""Windowed, robust per-bucket x mode estimates of the cross-rank critical path. Pure, no I/O.

Each (bucket, mode) keeps its last `window` samples, each with the monotonic time it was observed. Samples
older than `max_age` seconds drop out, so a mode that only gets probed (a few calls now and then) is judged on
recent probes, not on what it cost before the load changed. The estimate the policy compares is the median:
gloo collectives on a shared CPU have p90 several times their median, and a mean would chase those outliers.
Each window keeps its values sorted as they arrive (bisect), so a summary is an index, not a sort: the control
loop and every scrape ask for every (bucket, mode), and sorting the windows each time cost the sidecar several
% of a core next to the engine it observes.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from gatherwise.modes import Mode


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


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on a sorted list."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class _Window:
    """The newest `size` (time, seconds) samples in arrival order, and their values kept sorted (insort on add,
    bisect-remove on evict), so a median or p90 costs an index instead of a sort of the whole window."""

    __slots__ = ("ordered", "samples", "size")

    def __init__(self, size: int, samples: Iterable[tuple[float, float]] = ()) -> None:
        self.size = size
        self.samples: deque[tuple[float, float]] = deque()
        self.ordered: list[float] = []
        for t, v in samples:
            self.add(t, v)

    def add(self, t: float, v: float) -> None:
        if len(self.samples) >= self.size:
            self._evict()
        self.samples.append((t, v))
        insort(self.ordered, v)

    def _evict(self) -> None:
        _, v = self.samples.popleft()
        del self.ordered[bisect_left(self.ordered, v)]

    def prune(self, cutoff: float) -> bool:
        """Drop samples older than cutoff; True if any were dropped."""
        dropped = False
        while self.samples and self.samples[0][0] < cutoff:
            self._evict()
            dropped = True
        return dropped

    def summary(self, age_seconds: float) -> Estimate:
        ordered = self.ordered
        return Estimate(len(ordered), math.fsum(ordered) / len(ordered), _quantile(ordered, 0.5),
                        _quantile(ordered, 0.9), age_seconds)


class WindowEstimates:
    """Samples per (bucket, mode), for any mode code the rings report (windows are created on first use)."""

    def __init__(self, window: int, max_age_seconds: float) -> None:
        self.window, self.max_age = window, max_age_seconds
        self._windows: dict[tuple[int, Mode], _Window] = {}

    def add(self, bucket: int, mode: Mode, seconds: float, now: float) -> None:
        key = (bucket, mode)
        w = self._windows.get(key)
        if w is None:
            w = self._windows[key] = _Window(self.window)
        w.add(now, seconds)

    def get(self, bucket: int, mode: Mode, now: float) -> Estimate | None:
        """The estimate from the samples still inside the window and younger than max_age; None if none."""
        w = self._windows.get((bucket, mode))
        if w is None:
            return None
        w.prune(now - self.max_age)
        if not w.samples:
            return None
        return w.summary(max(0.0, now - w.samples[-1][0]))

    def recent(self, bucket: int, mode: Mode, n: int, before: float | None = None) -> list[float]:
        """The values of the newest `n` samples (taken before `before`, when given), oldest first."""
        w = self._windows.get((bucket, mode))
        if w is None or n <= 0:
            return []
        out: list[float] = []
        for t, v in reversed(w.samples):
            if before is not None and t >= before:
                continue
            out.append(v)
            if len(out) == n:
                break
        return out[::-1]

    def span(self, bucket: int, mode: Mode) -> tuple[float, float] | None:
        """(oldest, newest) sample time of a window, or None when it is empty."""
        w = self._windows.get((bucket, mode))
        return (w.samples[0][0], w.samples[-1][0]) if w is not None and w.samples else None

    def newest(self, bucket: int, mode: Mode) -> float | None:
        """Monotonic time of the newest sample (before pruning), or None."""
        w = self._windows.get((bucket, mode))
        return w.samples[-1][0] if w is not None and w.samples else None

    def resize(self, window: int, max_age_seconds: float) -> None:
        """Apply new policy parameters, keeping the newest samples."""
        self.window, self.max_age = window, max_age_seconds
        self._windows = {k: _Window(window, list(w.samples)[-window:]) for k, w in self._windows.items()}

    # -- durable state (the sidecar-state.json file) -------------------------------------------------------
    def to_json(self) -> dict[str, list[list[float]]]:
        return {f"{b}:{m.label}": [list(s) for s in w.samples] for (b, m), w in sorted(self._windows.items(),
                                                                                     key=lambda kv: kv[0])
                if w.samples}

    def load_json(self, data: dict[str, list[list[float]]]) -> None:
        for key, values in data.items():
            bucket, label = key.split(":")
            samples = [(float(t), float(s)) for t, s in values]
            self._windows[(int(bucket), Mode.parse(label))] = _Window(self.window, samples[-self.window:])


class KindMix:
    """The call kinds of a bucket's newest `size` calls, with their counts kept as calls arrive and leave."""

    __slots__ = ("counts", "kinds")

    def __init__(self, size: int, kinds: Iterable[int] = ()) -> None:
        self.kinds: deque[int] = deque(maxlen=size)
        self.counts: dict[int, int] = {}
        for kind in kinds:
            self.add(kind)

    def add(self, kind: int) -> None:
        kinds, counts = self.kinds, self.counts
        if len(kinds) == kinds.maxlen:
            old = kinds[0]
            counts[old] -= 1
            if not counts[old]:
                del counts[old]
        kinds.append(kind)
        counts[kind] = counts.get(kind, 0) + 1
