"""The logits path over time, for the live page (GET /v1/live): bounded points taken from what ingest already keeps.

A point is the difference between two readings of the attached engine's histograms and ring-header counters:
per (mode, bucket) the calls of the interval and the p50/p99 of their critical path (interpolated inside the
histogram's power-of-two buckets, as Prometheus' histogram_quantile does, so the page and a dashboard agree),
and the share of rank 0's wall time spent in the logits path (while the engine is busy, the wall time between
calls is its steps: the path's share of the step). The sidecar's schedule takes a point every `min_interval`
seconds while an engine is attached, whether or not a page asks, so a page opened late shows the recent past at
once; the newest `max_points` are kept, so the history costs bounded memory and one small reading a second. A
request only copies points out. Like every read of the sidecar's moving state, it runs on the loop thread
(gatherwise.sidecar.control.loop): no lock of its own.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gatherwise.modes import LABEL_OF_CODE, bucket_label
from gatherwise.shm_format.engine_info import RankInfo, read_rank_info
from gatherwise.sidecar.ingest.attached_engine import AttachedEngine
from gatherwise.sidecar.ingest.poll import Ingest
from gatherwise.sidecar.metrics.record_histograms import BUCKETS

MAX_POINTS = 600
MIN_INTERVAL_S = 1.0


@dataclass(frozen=True)
class PathPoint:
    mode: str
    bucket: str
    calls: int
    p50_seconds: float
    p99_seconds: float


@dataclass(frozen=True)
class HistoryPoint:
    time: float  # unix seconds
    path_share: float | None  # rank 0's seconds in the logits path / wall seconds of the interval
    paths: list[PathPoint] = field(default_factory=list)  # (mode, bucket) pairs that had calls in the interval


def quantile(q: float, bounds: list[float], counts: list[int]) -> float | None:
    """The q-quantile of histogram counts (last slot above every bound), linear inside its bucket."""
    total = sum(counts)
    if total == 0:
        return None
    rank, seen = q * total, 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i == len(bounds):
                return bounds[-1]  # above the top bound: as histogram_quantile, the top bound
            lower = bounds[i - 1] if i else 0.0
            return lower + (bounds[i] - lower) * (rank - seen) / count
        seen += count
    return bounds[-1]


@dataclass
class _Reading:
    engine: str
    wall: float
    path_ns: int | None  # rank 0's cumulative logits-path ns (ring header), every mode
    counts: dict[tuple[int, int], list[int]]  # (mode code, bucket) -> critical-path histogram counts


class LiveHistory:
    def __init__(self, ingest: Ingest, *, max_points: int = MAX_POINTS, min_interval: float = MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        self.ingest, self.min_interval, self.clock, self.wall_clock = ingest, min_interval, clock, wall_clock
        self.points: deque[HistoryPoint] = deque(maxlen=max_points)
        self._last: _Reading | None = None
        self._last_at = float("-inf")
        self._rank_infos: tuple[str, list[RankInfo]] | None = None

    def take(self) -> float:
        """Take a point when one is due (the first reading of a new engine starts its own history); returns the
        seconds until the next is due, inf while no engine is attached (the schedule calls it again once one is)."""
        eng = self.ingest.engine
        if eng is None:
            return math.inf
        now = self.clock()
        if self._last is None or self._last.engine != eng.label:  # a new engine: its own history
            self.points.clear()
            self._last, self._last_at = self._read(eng), now
        elif now - self._last_at >= self.min_interval:
            reading = self._read(eng)
            self.points.append(self._point(self._last, reading))
            self._last, self._last_at = reading, now
        return max(0.0, self._last_at + self.min_interval - now)

    def newest(self, limit: int) -> tuple[str | None, list[HistoryPoint]]:
        """(engine label, its newest `limit` points, oldest first); takes none (`take` does, on the schedule)."""
        eng = self.ingest.engine
        if eng is None:
            return None, []
        if self._last is None or self._last.engine != eng.label:  # attached since the last point: none of its own
            return eng.label, []
        return eng.label, list(self.points)[-limit:]

    def rank_infos(self, eng: AttachedEngine) -> list[RankInfo]:
        """The rank info files of the ranks read here (every rank's, or its node's: the others' are on their own
        node); kept once each was read (each is written once, at install)."""
        if self._rank_infos is not None and self._rank_infos[0] == eng.label:
            return self._rank_infos[1]
        found = [info for rank in eng.ranks if (info := read_rank_info(eng.dir, rank)) is not None]
        if len(found) == len(eng.ranks):
            self._rank_infos = (eng.label, found)
        return found

    def _read(self, eng: AttachedEngine) -> _Reading:
        counts = {key: list(series.critical_path.counts) for key, series in list(eng.call_series.items())}
        path_ns = None
        if eng.readers and eng.ranks[0] not in eng.unreadable:  # rank 0, or this node's lowest rank
            try:
                header = eng.readers[0].header()
                path_ns = sum(row.ops["path"].ns for row in header.counters.values())
            except (ValueError, OSError):  # closed by an engine switch or no longer readable: no share this time
                pass
        return _Reading(eng.label, self.wall_clock(), path_ns, counts)

    def _point(self, old: _Reading, new: _Reading) -> HistoryPoint:
        share = None
        elapsed = new.wall - old.wall
        if old.path_ns is not None and new.path_ns is not None and elapsed > 0:
            share = min(1.0, max(0.0, (new.path_ns - old.path_ns) * 1e-9 / elapsed))
        bounds = list(BUCKETS)
        paths = []
        for (mode, bucket), counts in sorted(new.counts.items()):
            before = old.counts.get((mode, bucket), [0] * len(counts))
            delta = [a - b for a, b in zip(counts, before, strict=True)]
            p50, p99 = quantile(0.5, bounds, delta), quantile(0.99, bounds, delta)
            if p50 is not None and p99 is not None:
                paths.append(PathPoint(LABEL_OF_CODE.get(mode, str(mode)), bucket_label(bucket), sum(delta), p50, p99))
        return HistoryPoint(new.wall, share, paths)
