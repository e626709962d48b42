"""The engine instance the sidecar reads, and what it has read from it: the sidecar's one record of that engine.

Discovery (gatherwise.sidecar.ingest.discovery) opens its rings, ingest (gatherwise.sidecar.ingest.poll) fills it;
its control side (gatherwise.sidecar.control.session.ControlSession) refers to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gatherwise.shm_format.hooks_off import HooksOffNotice
from gatherwise.shm_format.liveness import Liveness, liveness
from gatherwise.shm_format.node_ranks import NodeRanks
from gatherwise.shm_format.ring import CallRecord, RingHeader
from gatherwise.sidecar.ingest.ring_reader import RingReader
from gatherwise.sidecar.metrics.record_histograms import CallSeries


@dataclass
class PendingCall:
    """A call some ranks' records have arrived for."""

    first_seen_ns: int
    by_rank: dict[int, CallRecord] = field(default_factory=dict)


@dataclass
class AttachedEngine:
    engine_id: int
    label: str  # engine id as 16 hex digits: the `engine` label of every series
    dir: Path
    tp_size: int
    vocab: int
    dtype: str
    ranks: tuple[int, ...]  # the TP ranks read here, ascending: every rank, or those of this node
    readers: list[RingReader]  # one per rank of `ranks`, in its order (so are `headers`)
    attached_ns: int
    headers: list[RingHeader] = field(default_factory=list)  # latest per rank
    node: NodeRanks | None = None  # the directory's node file, where the engine wrote one
    dropped: dict[int, int] = field(default_factory=dict)  # rank -> records this sidecar lost
    unreadable: dict[int, str] = field(default_factory=dict)  # rank -> why its ring is no longer read
    exited: bool = False  # its liveness locks were found free: every rank's process has ended
    replaced: bool = False  # a newer engine instance is read instead
    last_record_end_ns: int = 0
    pending: dict[int, PendingCall] = field(default_factory=dict)
    call_series: dict[tuple[int, int], CallSeries] = field(default_factory=dict)  # (mode code, bucket index)
    records: int = 0
    calls_joined: int = 0
    calls_incomplete: int = 0

    @property
    def partial(self) -> bool:
        """Only some of the group's ranks are read: a node of a multi-node group. Cross-rank figures then cover
        this node's ranks only (their clocks are unrelated to other nodes')."""
        return len(self.ranks) < self.tp_size

    @property
    def tp_node(self) -> str:
        """The node's index in the group, the `tp_node` label of the node-local families ("0" without a node
        file: then every rank is read)."""
        return str(self.node.node_index) if self.node is not None else "0"

    def stopped_reason(self) -> str | None:
        """Why this engine is not running any more, or None while it may be (a command still reaches it): the
        sidecar follows a newer instance, it closed its rings, its processes are gone (liveness locks free), or
        its directory was removed."""
        if self.replaced:
            return "the sidecar no longer follows it"
        if any(h.closed for h in self.headers):
            return "it shut down (its rings are closed)"
        if self.exited:
            return "its processes exited"
        try:
            state = liveness(self.dir)
        except FileNotFoundError:
            return "its shared-memory directory was removed"
        except OSError:
            return None
        return "its processes exited" if state is Liveness.DEAD else None


@dataclass(frozen=True)
class EngineInfo:
    """What the sidecar knows of the attached engine and has ingested from it (GET /v1/engine, /readyz)."""

    attached: bool
    shm_dir: str
    engine_id: str | None = None
    tp_size: int | None = None
    ranks: tuple[int, ...] = ()  # the TP ranks this sidecar reads: every rank, or those of its node
    node_index: int | None = None  # the node among the group's (rank 0's is 0), from the engine's node file
    nodes: int | None = None  # how many nodes the group spans, from the same file
    vocab: int | None = None
    dtype: str | None = None
    up: bool = False
    heartbeat_age_seconds: float | None = None  # since the newest call ended (Ingest.newest_record_age_seconds)
    records_ingested: int = 0
    records_dropped: int = 0
    calls_joined: int = 0
    calls_incomplete: int = 0
    calls_pending: int = 0
    traces_started: int = 0
    engines_seen: int = 0
    hooks_off: tuple[HooksOffNotice, ...] = ()  # engine processes whose hooks refused or never engaged
