"""The sidecar's registry and /metrics exposition: every family, each built with its data source.

The sidecar owns its own CollectorRegistry (not prometheus_client's multiprocess mode: that has no exemplars).
Family names: gatherwise.sidecar.metrics.names (reference: docs/metrics.md). The record histograms are rendered
by the exposition itself, ahead of the registry's families.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from gatherwise.sidecar.metrics.record_histograms import RecordHistograms


class SidecarMetrics:
    def __init__(self, histograms: RecordHistograms, collectors: Iterable[Collector] = ()) -> None:
        disable_created_metrics()  # no *_created series: noise for dashboards (process-wide; the sidecar owns it)
        self.histograms = histograms
        self.registry = CollectorRegistry(auto_describe=True)
        for collector in collectors:
            self.registry.register(collector)

    def exposition(self, accept_header: str | None) -> tuple[bytes, str]:
        """(body, content type): OpenMetrics with exemplars when the Accept header asks, classic text otherwise."""
        encoder, content_type = choose_encoder(accept_header or "")
        openmetrics = content_type.startswith("application/openmetrics-text")
        histograms = self.histograms.render(openmetrics).encode()
        return histograms + encoder(self.registry), content_type  # the registry's part ends with `# EOF`
