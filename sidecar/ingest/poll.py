"""Ingest: shared-memory rings of the newest engine instance -> metrics, traces and the policy's samples.

The sidecar's schedule (gatherwise.sidecar.control.schedule) calls `poll_once()` when it expects a batch of records
while an engine is attached, and at each discovery deadline (`Poll.seconds_to_discovery`) while none is. Each poll reads
the new records of every rank (read-only, with pread: the engine never waits for it), joins them across ranks by call
index, and turns each call into histogram observations and, when sampled, a trace; the poll returns every
joined call (the policy's input: the schedule hands them on). A call is joined when the record of every rank read
here has arrived, or after a bounded delay (then it counts as incomplete and only its per-rank parts are
observed). The ranks read here are every rank of the group, or, on a node of a multi-node group, the ranks the
engine's node file names (gatherwise/shm_format/node_ranks.py); then the cross-rank figures are node-local and go
into families of their own, labelled with the node (gatherwise.sidecar.metrics.record_histograms). A new
engine instance id in shm_dir is an engine restart: ingest switches to it and drops the old instance's series, so
series never mix.

Discovery (gatherwise.sidecar.ingest.discovery) says which engine to read. One poll reads at most
`max_records_per_poll` records per rank, and a newly attached engine is read from at most that many records back,
so a full ring of the largest allowed capacity costs bounded time and memory per poll.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gatherwise.modes import LABEL_OF_CODE, bucket_of
from gatherwise.shm_format.ring import CallRecord
from gatherwise.sidecar.ingest.attached_engine import AttachedEngine, EngineInfo, PendingCall
from gatherwise.sidecar.ingest.discovery import Discovery
from gatherwise.sidecar.ingest.hooks_off import HooksOffWatch
from gatherwise.sidecar.ingest.joined_call import JoinedCall
from gatherwise.sidecar.ingest.ring_reader import RingFormatError
from gatherwise.sidecar.metrics.header_counters import EngineCounters, rank_counters
from gatherwise.sidecar.metrics.record_histograms import RecordHistograms
from gatherwise.sidecar.traces.tracer import CallTracer

log = logging.getLogger("gatherwise.sidecar.ingest")

DEFAULT_MAX_RECORDS_PER_POLL = 16384  # sidecar.max_records_per_poll


@dataclass
class Poll:
    """What one poll read."""

    records: int  # records read, every rank together
    calls: list[JoinedCall] = field(default_factory=list)  # complete calls, in the order they were joined
    engine: AttachedEngine | None = None  # the engine read (the newest one running), None before the first
    seconds_to_discovery: float = 0.0  # until the next poll looks for engines


class Ingest:
    def __init__(self, shm_dir: str | Path, histograms: RecordHistograms, hooks_off: HooksOffWatch,
                 tracer: CallTracer | None = None, *, join_timeout: float = 0.5, heartbeat_stale: float = 5.0,
                 discover_interval: float = 0.5, clock: Callable[[], int] = time.monotonic_ns,
                 max_records_per_poll: int = DEFAULT_MAX_RECORDS_PER_POLL, remove_dead_dirs: bool = True) -> None:
        """`hooks_off` is re-read at each discovery pass (the same watch feeds /metrics and /readyz)."""
        if max_records_per_poll < 1:
            raise ValueError(f"max_records_per_poll must be >= 1, got {max_records_per_poll}")
        self.shm_dir = Path(shm_dir)
        self.hooks_off = hooks_off
        self.max_records_per_poll = max_records_per_poll
        self.discovery = Discovery(self.shm_dir, hooks_off, max_backlog=max_records_per_poll,
                                   remove_dead_dirs=remove_dead_dirs)
        self.histograms, self.tracer = histograms, tracer
        self.join_timeout_ns = int(join_timeout * 1e9)
        self.heartbeat_stale = heartbeat_stale
        self.discover_interval_ns = int(discover_interval * 1e9)
        self.clock = clock
        self.engine: AttachedEngine | None = None
        self.engines_seen = 0
        self.next_discovery_ns = 0  # clock() value from which the next poll looks for engines

    # -- one iteration (on the sidecar's loop) -----------------------------------------------------------
    def poll_once(self) -> Poll:
        """Discover (when due), read every rank's new records, join and emit."""
        now = self.clock()
        if now >= self.next_discovery_ns:
            self.next_discovery_ns = now + self.discover_interval_ns
            newer = self.discovery.newer_engine(self.engine, now)
            if newer is not None:
                self._switch(newer)
        eng = self.engine
        poll = Poll(0, engine=eng)
        if eng is not None:
            poll.records = self._read(eng, now, poll.calls)
        poll.seconds_to_discovery = max(0.0, (self.next_discovery_ns - self.clock()) * 1e-9)
        return poll

    def _read(self, eng: AttachedEngine, now: int, calls: list[JoinedCall]) -> int:
        """Every rank's new records, joined into `calls`; returns the records read."""
        read = 0
        pending, held = eng.pending, len(eng.ranks)
        for rank, reader in zip(eng.ranks, eng.readers, strict=True):
            if rank in eng.unreadable:
                continue
            try:
                records, missed = reader.read_new(self.max_records_per_poll, now)
            except (RingFormatError, OSError) as exc:  # truncated or replaced under us: stop reading this rank
                eng.unreadable[rank] = str(exc)
                log.warning("engine %s rank %d: ring no longer readable, its telemetry stops here: %s", eng.label,
                            rank, exc)
                continue
            eng.dropped[rank] = eng.dropped.get(rank, 0) + missed
            read += len(records)
            for rec in records:
                slot = pending.get(rec.call_index)
                if slot is None:
                    slot = pending[rec.call_index] = PendingCall(now)
                slot.by_rank[rank] = rec
                if len(slot.by_rank) == held:  # every rank read here reported it
                    del pending[rec.call_index]
                    self._emit(eng, rec.call_index, slot.by_rank, True, calls)
        eng.records += read
        if pending:
            expired = [ci for ci, slot in pending.items() if now - slot.first_seen_ns > self.join_timeout_ns]
            for ci in expired:
                self._emit(eng, ci, pending.pop(ci).by_rank, False, calls)
        return read

    def _emit(self, eng: AttachedEngine, call_index: int, by_rank: dict[int, CallRecord], complete: bool,
              joined: list[JoinedCall]) -> None:
        first = next(iter(by_rank.values()))
        mode, bucket = first.mode, bucket_of(max(first.rows, 1))  # the bucket of the call, for every consumer
        calls = eng.call_series.get((mode, bucket))
        if calls is None:
            if mode not in LABEL_OF_CODE:  # a mode code no engine writes (the format allows 3): nothing to show
                eng.calls_incomplete += 1
                return
            calls = eng.call_series[(mode, bucket)] = self.histograms.call_series(
                eng.label, mode, bucket, eng.ranks, eng.tp_node if eng.partial else None)
        exemplar = None
        tracer = self.tracer
        if tracer is not None and tracer.should_sample(call_index):
            exemplar = {"trace_id": tracer.trace_call(eng.label, eng.tp_size, call_index, by_rank, complete,
                                                      root=0 in eng.ranks)}
        first_op, second_ops, sample, rank_paths = calls.first_op, calls.second_ops, calls.sample, calls.rank_paths
        max_start = max_end = 0
        min_start = first.start_ns  # first is one of by_rank: the loop takes the minimum over every rank
        for rank, rec in by_rank.items():
            first_op.observe(rec.collective_ns * 1e-9, exemplar)
            if rec.second_op is not None:
                second_ops[rec.second_op].observe(rec.second_ns * 1e-9, exemplar)
            if rec.sample_ns or rank == 0:  # ranks that did not sample (gather mode, rank > 0) record 0
                sample.observe(rec.sample_ns * 1e-9, exemplar)
            start, end = rec.start_ns, rec.end_ns
            rank_paths[rank].observe((end - start) * 1e-9, exemplar)
            if start > max_start:
                max_start = start
            if end > max_end:
                max_end = end
            if start < min_start:
                min_start = start
        if max_end > eng.last_record_end_ns:
            eng.last_record_end_ns = max_end
        if not complete:
            eng.calls_incomplete += 1
            return
        eng.calls_joined += 1
        critical = (max_end - max_start) * 1e-9
        calls.critical_path.observe(critical, exemplar)
        calls.skew.observe((max_start - min_start) * 1e-9, exemplar)
        seconds = critical
        root = by_rank.get(0)
        if eng.partial and root is not None:  # rank 0's path includes waiting for the other nodes' shards
            seconds = (root.end_ns - root.start_ns) * 1e-9
        joined.append(JoinedCall(eng, call_index, mode, bucket, seconds, first.tag, by_rank[eng.ranks[0]].start_ns))

    # -- engine restarts ----------------------------------------------------------------------------------
    def _switch(self, attached: AttachedEngine) -> None:
        old, self.engine = self.engine, attached
        self.engines_seen += 1
        if old is not None:
            log.info("engine restart: %s -> %s", old.label, attached.label)
            old.replaced = True
            self.histograms.forget_engine(old.label)
            for reader in old.readers:
                reader.close()
        else:
            log.info("attached engine %s (tp=%d)", attached.label, attached.tp_size)

    # -- views for the header collector, /readyz and GET /v1/engine (handed to the loop thread; read-only) ---
    def newest_record_age_seconds(self, eng: AttachedEngine) -> float:
        """Seconds since the engine last finished a call (its newest record), or since attach if none yet: the
        engine heartbeat of /metrics, /readyz and /v1/engine. (GET /v1/mode's heartbeat is another one: since rank
        0 started its latest call, from the control block.)"""
        return max(0.0, (self.clock() - (eng.last_record_end_ns or eng.attached_ns)) * 1e-9)

    def is_up(self, eng: AttachedEngine, age: float) -> bool:
        """Fresh heartbeat and no sign that the engine stopped (closed rings, exited processes, its directory
        removed). Asked at the moment of the scrape or API call: engines whose ranks exit without closing their
        rings remove the directory from their last process, which a discovery pass may not have seen yet."""
        return age < self.heartbeat_stale and eng.stopped_reason() is None

    def _refresh_headers(self, eng: AttachedEngine) -> None:
        """Read every rank's header now (scrapes and API calls; the poll loop does not parse headers it does not
        need). A reader closed by an engine switch meanwhile, or a ring no longer readable, keeps the previous
        snapshot."""
        for i, (rank, reader) in enumerate(zip(eng.ranks, eng.readers, strict=True)):
            if rank in eng.unreadable:
                continue
            try:
                eng.headers[i] = reader.header()
            except (ValueError, OSError):
                pass

    def counters(self) -> EngineCounters | None:
        eng = self.engine
        if eng is None:
            return None
        self._refresh_headers(eng)
        age = self.newest_record_age_seconds(eng)
        ranks = [rank_counters(h, rank, {"overwritten": r.overwritten, "torn": r.torn, "invalid": r.invalid})
                 for rank, h, r in zip(eng.ranks, eng.headers, eng.readers, strict=True)]
        return EngineCounters(eng.label, self.is_up(eng, age), age, ranks)

    def info(self) -> EngineInfo:
        eng = self.engine
        if eng is None:
            return EngineInfo(attached=False, shm_dir=str(self.shm_dir), engines_seen=self.engines_seen,
                              hooks_off=self.hooks_off.notices)
        self._refresh_headers(eng)
        age = self.newest_record_age_seconds(eng)
        node = eng.node
        return EngineInfo(True, str(self.shm_dir), eng.label, eng.tp_size, eng.ranks,
                          node.node_index if node else None, node.nodes if node else None, eng.vocab, eng.dtype,
                          self.is_up(eng, age), age, eng.records, sum(eng.dropped.values()), eng.calls_joined,
                          eng.calls_incomplete, len(eng.pending), self.tracer.traces_started if self.tracer else 0,
                          self.engines_seen, self.hooks_off.notices)

