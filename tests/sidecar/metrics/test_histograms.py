"""gatherwise.sidecar.metrics.histogram_family agrees with prometheus_client's Histogram, sample for sample,
exemplars included.

Its series are handed to prometheus_client's own encoders through the collector below (the sidecar itself renders
them with HistogramFamily.render): what they encode is checked against a reference Histogram, and render against
what they encode."""

from __future__ import annotations

import random
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gatherwise.sidecar.metrics.histogram_family import HistogramFamily
from gatherwise.sidecar.metrics.record_histograms import BUCKETS


class HistogramsCollector(Collector):
    """HistogramFamily series as prometheus_client metric families, for its encoders."""

    def __init__(self, families: Iterable[HistogramFamily]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        for fam in self.families:
            family = HistogramMetricFamily(fam.name, fam.documentation, labels=fam.labelnames)
            for labels, s in fam._series.items():
                cumulative, buckets = 0, []
                les = [*(floatToGoString(b) for b in fam.bounds), "+Inf"]
                for le, count, exemplar in zip(les, s.counts, s.exemplars, strict=True):
                    cumulative += count
                    buckets.append((le, cumulative, exemplar) if exemplar is not None else (le, cumulative))
                family.add_metric(list(labels), buckets, s.sum)
            yield family


def _samples(registry: CollectorRegistry) -> dict:
    text = openmetrics(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples if not s.name.endswith("_created")}


def test_same_buckets_counts_and_sums_as_prometheus_client() -> None:
    rng = random.Random(7)
    values = [rng.choice(BUCKETS) for _ in range(50)] + [rng.uniform(0, 3.0) for _ in range(500)] + [0.0, 5.0]
    ours_reg, ref_reg = CollectorRegistry(), CollectorRegistry()
    ours = HistogramFamily("x_seconds", "x", ["rank"], BUCKETS)
    ours_reg.register(HistogramsCollector([ours]))
    ref = Histogram("x_seconds", "x", ["rank"], buckets=BUCKETS, registry=ref_reg)
    for i, v in enumerate(values):
        ours.series(str(i % 2)).observe(v)
        ref.labels(str(i % 2)).observe(v)
    got, want = _samples(ours_reg), _samples(ref_reg)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-9, key


def test_exemplar_lands_in_the_bucket_of_its_value_and_series_can_be_removed() -> None:
    reg = CollectorRegistry()
    fam = HistogramFamily("y_seconds", "y", ["engine"], BUCKETS)
    reg.register(HistogramsCollector([fam]))
    fam.series("a").observe(3e-5, {"trace_id": "ab" * 16})
    fam.series("b").observe(1.0)
    text = openmetrics(reg).decode()
    (line,) = [ln for ln in text.splitlines() if "trace_id" in ln]
    assert line.startswith('y_seconds_bucket{engine="a",le="4e-05"} 1.0 # {trace_id="' + "ab" * 16 + '"} 3e-05')
    fam.remove_where("engine", "a")
    assert 'engine="a"' not in openmetrics(reg).decode()


def test_render_matches_prometheus_client_in_both_formats() -> None:
    """HistogramFamily.render writes the lines itself (speed); a parser must read exactly what prometheus_client's
    encoders write for the same family, exemplars included."""
    from prometheus_client.exposition import generate_latest as classic

    rng = random.Random(3)
    fam = HistogramFamily("z_seconds", 'z "quoted" \\ doc', ["engine", "mode"], BUCKETS)
    reg = CollectorRegistry()
    reg.register(HistogramsCollector([fam]))
    for i in range(300):
        exemplar = {"trace_id": f"{i:032x}"} if i % 17 == 0 else None
        fam.series("e", ("a", "b\"q")[i % 2]).observe(rng.uniform(0, 2e-3), exemplar)

    def parsed(text: str) -> dict:
        return {(s.name, tuple(sorted(s.labels.items()))): (s.value, s.exemplar)
                for f in text_string_to_metric_families(text) for s in f.samples}

    assert parsed(fam.render(openmetrics=False)) == parsed(classic(reg).decode())
    ours_om = fam.render(openmetrics=True) + "# EOF\n"
    want_om = openmetrics(reg).decode()
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse

    def om(text: str) -> dict:
        return {(s.name, tuple(sorted(s.labels.items()))): (s.value, s.exemplar)
                for f in om_parse(text) for s in f.samples}

    assert om(ours_om) == om(want_om)
    assert any(exemplar is not None for _, exemplar in om(ours_om).values())
