"""The histograms fed from ring records: per-op, sampling, per-rank path, critical path and skew.

Ingest (gatherwise.sidecar.ingest.poll) takes the bundle of series a call feeds (`CallSeries`) once per engine, mode
and bucket, then only observes; /metrics renders them itself
(gatherwise.sidecar.metrics.histogram_family.HistogramFamily.render), not through the registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gatherwise.modes import Mode, bucket_label
from gatherwise.shm_format.ring import MODE_OPS
from gatherwise.sidecar.metrics.histogram_family import HistogramFamily, Series
from gatherwise.sidecar.metrics.names import (
    COLLECTIVE_SECONDS,
    LOGITS_PATH_SECONDS,
    NODE_RANK_SKEW_SECONDS,
    NODE_STEP_CRITICAL_PATH_SECONDS,
    RANK_SKEW_SECONDS,
    SAMPLE_SECONDS,
    STEP_CRITICAL_PATH_SECONDS,
)

# 10 µs .. 1.3 s: collectives on one host are tens of µs (GPU) to tens of ms (gloo, big vocab).
BUCKETS = tuple(1e-5 * 2**i for i in range(18))
# Every second operation a record can name (gatherwise.shm_format.ring.second_op_of).
SECOND_OPS = tuple(op for _, op in MODE_OPS.values() if op is not None)


@dataclass(frozen=True, slots=True)
class CallSeries:
    """Every series a call of one (mode, bucket) feeds, resolved together the first time ingest meets that pair:
    per call (critical path, skew), pooled over ranks (ops, sample), and each rank's logits path.

    Why no rank label on the bucketed ones: per-rank x per-bucket x per-mode histograms carry no decision (the
    policy compares modes per bucket on the critical path) and at TP=8 with three modes they alone were ~24 000
    series. Where a rank matters (a straggler, a slow link) it shows without the bucket:
    gatherwise_logits_path_seconds per rank and mode, and the exact per-rank counters from the ring headers."""

    critical_path: Series
    skew: Series
    sample: Series
    first_op: Series  # the mode's first collective (MODE_OPS)
    second_ops: dict[str, Series]  # every op of SECOND_OPS; each is exposed once a record timed it
    rank_paths: dict[int, Series]  # rank -> its logits path in this mode, every bucket's; exposed once it reported


class RecordHistograms:
    def __init__(self) -> None:
        self.collective = HistogramFamily(
            COLLECTIVE_SECONDS, "Duration of each collective of the logits path, pooled over the ranks.",
            ["engine", "op", "mode", "bucket"], BUCKETS)
        self.sample = HistogramFamily(SAMPLE_SECONDS, "Duration of sampling, pooled over the ranks that sample.",
                                      ["engine", "mode", "bucket"], BUCKETS)
        self.logits_path = HistogramFamily(LOGITS_PATH_SECONDS, "Logits ready to tokens ready, per rank.",
                                           ["engine", "rank", "mode"], BUCKETS)
        self.critical_path = HistogramFamily(
            STEP_CRITICAL_PATH_SECONDS, "Per call: last rank to arrive to last rank holding its tokens.",
            ["engine", "mode", "bucket"], BUCKETS)
        self.skew = HistogramFamily(RANK_SKEW_SECONDS, "Per call: latest minus earliest rank arrival.",
                                    ["engine", "mode"], BUCKETS)
        # A sidecar on one node of a multi-node group sees that node's ranks only, on that node's clock: its
        # cross-rank figures go into families of their own, so that no sum over the group-wide ones (recording
        # rules, dashboards) ever adds up the nodes' partial views; tp_node tells the nodes apart.
        self.node_critical_path = HistogramFamily(
            NODE_STEP_CRITICAL_PATH_SECONDS, "Per call, this node's ranks only: last rank to arrive to last rank "
            "holding its tokens.", ["engine", "tp_node", "mode", "bucket"], BUCKETS)
        self.node_skew = HistogramFamily(NODE_RANK_SKEW_SECONDS, "Per call, this node's ranks only: latest minus "
                                         "earliest rank arrival.", ["engine", "tp_node", "mode"], BUCKETS)
        self.families = (self.collective, self.sample, self.logits_path, self.critical_path, self.skew,
                         self.node_critical_path, self.node_skew)

    def call_series(self, engine: str, mode: int, bucket: int, ranks: Sequence[int],
                    tp_node: str | None = None) -> CallSeries:
        """The series of `engine`'s calls in `mode` (a code, as the call record carries it) and `bucket` (an index),
        labelled here once; `ranks`: the ranks read. `tp_node`: the node whose ranks alone are read (its cross-rank
        figures are node-local), None when every rank of the group is."""
        code = Mode(mode)
        label, bucket_ = code.label, bucket_label(bucket)
        if tp_node is None:
            critical, skew = self.critical_path.series(engine, label, bucket_), self.skew.series(engine, label)
        else:
            critical = self.node_critical_path.series(engine, tp_node, label, bucket_)
            skew = self.node_skew.series(engine, tp_node, label)
        return CallSeries(
            critical, skew, self.sample.series(engine, label, bucket_),
            self.collective.series(engine, MODE_OPS[code][0], label, bucket_),
            {op: self.collective.series(engine, op, label, bucket_, shown_empty=False) for op in SECOND_OPS},
            {rank: self.logits_path.series(engine, str(rank), label, shown_empty=False) for rank in ranks})

    def forget_engine(self, engine: str) -> None:
        """Drop every series of a previous engine instance (after an engine restart)."""
        for family in self.families:
            family.remove_where("engine", engine)

    def render(self, openmetrics: bool) -> str:
        return "".join(family.render(openmetrics) for family in self.families)
