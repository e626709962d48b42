"""`gatherwise_engine_route_info`: which engine runner and logits route is live on each rank read here, and what its
fingerprints matched, as an info gauge (1 per rank; the text in its labels), from the ranks' info files
(gatherwise/shm_format/engine_info.py). A rank whose info file is not read yet has no series."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gatherwise.shm_format.engine_info import RankInfo
from gatherwise.sidecar.metrics.names import ENGINE_ROUTE_INFO


class EngineRouteCollector(Collector):
    def __init__(self, rank_infos: Callable[[], tuple[str, Sequence[RankInfo]] | None]) -> None:
        """`rank_infos`: (engine label, the info files of its ranks read here), None while no engine is attached."""
        self.rank_infos = rank_infos

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(ENGINE_ROUTE_INFO, "1 per rank: the engine's runner class on it, the runner "
                                   "gatherwise recognised it as and what that runner's fingerprints matched "
                                   "(its rank info file).",
                                   labels=["engine", "rank", "engine_kind", "runner", "route", "fingerprint"])
        found = self.rank_infos()
        if found is not None:
            engine, infos = found
            for info in infos:
                family.add_metric([engine, str(info.rank), info.kind, info.route.runner, info.route.route,
                                   info.route.fingerprint], 1.0)
        yield family
