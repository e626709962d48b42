"""Lean histograms for the ingest loop: one thread, plain lists, text exposition written by hand.

prometheus_client's Histogram.observe costs ~1 µs (a lock, a linear bucket scan, two value objects); a call
at TP=2 makes ~9 observations, which capped the sidecar near 100k records/s. Here an observation is a bisect
and two list updates. Only the sidecar's loop thread touches them, scrapes included (the /metrics exposition
runs there: gatherwise.sidecar.control.loop), so no lock is needed and a scrape never sees half an observation.
The `_count` and `+Inf` bucket are both derived from the same per-bucket counts, so they always agree.

Exposition (`render`) writes the text lines itself, from line prefixes cached per series: prometheus_client's
encoders cost ~10 µs per sample, and a TP=8 engine with three modes has ~4 000 histogram samples, which made a
scrape take 60-100 ms. The output is the same samples in the same two formats (tests compare them).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString


class Series:
    """One label set: counts per bucket (last slot: above every bound), sum, latest exemplar per bucket.

    `shown_empty` False: the series is exposed from its first observation on. Callers resolve every series a kind
    of call may feed at once, ahead of the calls; a label set only some calls have (an op a record may name, a rank
    that may report) must not appear before one of them did."""

    __slots__ = ("bounds", "counts", "exemplars", "shown_empty", "sum")

    def __init__(self, bounds: list[float], shown_empty: bool = True) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.exemplars: list[Exemplar | None] = [None] * (len(bounds) + 1)
        self.shown_empty = shown_empty

    def observe(self, value: float, exemplar: dict[str, str] | None = None) -> None:
        i = bisect_left(self.bounds, value)  # first bound >= value: Prometheus buckets are `le`
        self.counts[i] += 1
        self.sum += value
        if exemplar is not None:
            self.exemplars[i] = Exemplar(exemplar, value, time.time())


class HistogramFamily:
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.bounds = sorted(float(b) for b in buckets)
        self._les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        self._series: dict[tuple[str, ...], Series] = {}
        self._prefixes: dict[tuple[str, ...], tuple[list[str], str, str]] = {}  # labels -> bucket, count, sum

    def series(self, *labels: str, shown_empty: bool = True) -> Series:
        """The series of a label set, created on first use (callers keep it: lookups are not free). Asked for with
        `shown_empty` once, it is exposed from then on, observed or not."""
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {labels}")
        found = self._series.get(labels)
        if found is None:
            found = self._series[labels] = Series(self.bounds, shown_empty)
        elif shown_empty:
            found.shown_empty = True
        return found

    def remove_where(self, label: str, value: str) -> None:
        i = self.labelnames.index(label)
        for key in [k for k in list(self._series) if k[i] == value]:
            del self._series[key]
            self._prefixes.pop(key, None)

    def _line_prefixes(self, labels: tuple[str, ...]) -> tuple[list[str], str, str]:
        found = self._prefixes.get(labels)
        if found is None:
            pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(self.labelnames, labels, strict=True))
            sep = "," if pairs else ""
            found = self._prefixes[labels] = (
                [f'{self.name}_bucket{{{pairs}{sep}le="{le}"}} ' for le in self._les],
                f"{self.name}_count{{{pairs}}} ", f"{self.name}_sum{{{pairs}}} ")
        return found

    def render(self, openmetrics: bool) -> str:
        """This family in the classic text format, or in OpenMetrics (with exemplars; no `# EOF`)."""
        out = [f"# HELP {self.name} {_escape_help(self.documentation)}\n# TYPE {self.name} histogram\n"]
        append = out.append
        for labels, s in list(self._series.items()):
            counts, exemplars = list(s.counts), list(s.exemplars)
            if not s.shown_empty and not any(counts):
                continue
            buckets, count_prefix, sum_prefix = self._line_prefixes(labels)
            cumulative = 0
            for prefix, count, exemplar in zip(buckets, counts, exemplars, strict=True):
                cumulative += count
                if openmetrics and exemplar is not None:
                    ex = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(exemplar.labels.items()))
                    append(f"{prefix}{cumulative} # {{{ex}}} {floatToGoString(exemplar.value)} {exemplar.timestamp}\n")
                else:
                    append(f"{prefix}{cumulative}\n")
            append(f"{count_prefix}{cumulative}\n{sum_prefix}{floatToGoString(s.sum)}\n")
        return "".join(out)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")

