"""The ingest loop: shared-memory rings of the newest engine instance -> metrics and traces.

Every poll interval it reads the new records of every rank (read-only mmaps: the engine never waits for
it), joins them across ranks by call index, and turns each call into histogram observations and, when
sampled, a trace. A call is joined when every rank's record has arrived, or after a bounded delay (then it
counts as incomplete and only its per-rank parts are observed). A new engine instance id in shm_dir is an
engine restart: the loop switches to it and drops the old instance's series, so series never mix.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_hooks.modes import Mode, bucket_label, bucket_of
from sidecar.header_counters import rank_counters
from sidecar.histograms import Series
from sidecar.metrics import CallSeries, EngineCounters, SidecarMetrics
from sidecar.periodic import PeriodicThread
from sidecar.ring_reader import EngineFiles, RingFormatError, RingReader, discover_engines
from sidecar.traces import CallTracer

log = logging.getLogger("gatherwise.sidecar.ingest")

_MODE_LABEL = {int(m): m.label for m in Mode}
_BUCKET_LABEL = [bucket_label(bucket_of(rows)) for rows in range(1, 1 << 15)]


def rows_bucket_label(rows: int) -> str:
    return _BUCKET_LABEL[rows - 1] if 0 < rows < len(_BUCKET_LABEL) else bucket_label(bucket_of(max(rows, 1)))


@dataclass
class _Pending:
    first_seen_ns: int
    by_rank: dict[int, Any] = field(default_factory=dict)


@dataclass
class AttachedEngine:
    """The engine instance being ingested and what has been read from it so far."""

    engine_id: int
    label: str  # engine id as 16 hex digits: the `engine` label of every series
    dir: Path
    tp_size: int
    vocab: int
    dtype: str
    readers: list[RingReader]
    attached_ns: int
    headers: list[Any] = field(default_factory=list)  # latest RingHeader per rank
    dropped: list[int] = field(default_factory=list)
    last_record_end_ns: int = 0
    pending: dict[int, _Pending] = field(default_factory=dict)
    rank_paths: dict[tuple[int, int], Series] = field(default_factory=dict)  # (rank, mode)
    call_series: dict[tuple[int, int], CallSeries] = field(default_factory=dict)  # (mode, rows)
    records: int = 0
    calls_joined: int = 0
    calls_incomplete: int = 0


@dataclass(frozen=True)
class EngineInfo:
    attached: bool
    engine_id: str | None = None
    tp_size: int | None = None
    vocab: int | None = None
    dtype: str | None = None
    up: bool = False
    heartbeat_age_seconds: float | None = None
    records_ingested: int = 0
    records_dropped: int = 0
    calls_joined: int = 0
    calls_incomplete: int = 0
    calls_pending: int = 0
    traces_started: int = 0


class Ingest:
    def __init__(self, shm_dir: str | Path, metrics: SidecarMetrics, tracer: CallTracer | None = None, *,
                 poll_interval: float = 0.02, join_timeout: float = 0.5, heartbeat_stale: float = 5.0,
                 discover_interval: float = 0.5, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.shm_dir = Path(shm_dir)
        self.metrics, self.tracer = metrics, tracer
        self.poll_interval = poll_interval
        self.join_timeout_ns = int(join_timeout * 1e9)
        self.heartbeat_stale = heartbeat_stale
        self.discover_interval_ns = int(discover_interval * 1e9)
        self.clock = clock
        self.engine: AttachedEngine | None = None
        self.engines_seen = 0
        self.listeners: list[Callable[[AttachedEngine | None, AttachedEngine], None]] = []  # on engine switch
        # per joined call: (engine, call_index, mode, rows, critical-path seconds); the control policy's input
        self.call_listeners: list[Callable[[AttachedEngine, int, int, int, float], None]] = []
        self._next_discover_ns = 0
        self._loop = PeriodicThread("gatherwise-ingest", self.poll_once, poll_interval, log)
        metrics.header_collector._snapshot = self.counters

    # -- thread -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._loop.stop(timeout)

    # -- one iteration ----------------------------------------------------------------------------------
    def poll_once(self) -> int:
        """Discover (rate-limited), read every rank's new records, join and emit. Returns records read."""
        now = self.clock()
        if now >= self._next_discover_ns or self.engine is None:
            self._next_discover_ns = now + self.discover_interval_ns
            self._discover(now)
        eng = self.engine
        if eng is None:
            return 0
        read = 0
        pending, tp = eng.pending, eng.tp_size
        for rank, reader in enumerate(eng.readers):
            records, missed = reader.read_new()
            eng.dropped[rank] += missed
            read += len(records)
            for rec in records:
                slot = pending.get(rec.call_index)
                if slot is None:
                    slot = pending[rec.call_index] = _Pending(now)
                slot.by_rank[rank] = rec
                if len(slot.by_rank) == tp:
                    del pending[rec.call_index]
                    self._emit(eng, rec.call_index, slot.by_rank, True)
        eng.records += read
        if pending:
            expired = [ci for ci, slot in pending.items() if now - slot.first_seen_ns > self.join_timeout_ns]
            for ci in expired:
                self._emit(eng, ci, pending.pop(ci).by_rank, False)
        return read

    def _emit(self, eng: AttachedEngine, call_index: int, by_rank: dict[int, Any], complete: bool) -> None:
        first = next(iter(by_rank.values()))
        mode, rows = first.mode, first.rows
        label = _MODE_LABEL.get(mode)
        if label is None:  # a mode code no engine writes (the format allows 3): nothing sensible to show
            eng.calls_incomplete += 1
            return
        exemplar = None
        tracer = self.tracer
        if tracer is not None and tracer.should_sample(call_index):
            exemplar = {"trace_id": tracer.trace_call(eng.label, eng.tp_size, call_index, by_rank, complete)}
        calls = eng.call_series.get((mode, rows))
        if calls is None:
            calls = eng.call_series[(mode, rows)] = self.metrics.call_series(eng.label, mode, rows_bucket_label(rows))
        paths = eng.rank_paths
        max_start = max_end = 0
        min_start = None
        for rank, rec in by_rank.items():
            path = paths.get((rank, mode))
            if path is None:
                path = paths[(rank, mode)] = self.metrics.rank_path(eng.label, str(rank), label)
            calls.first_op.observe(rec.collective_ns * 1e-9, exemplar)
            if rec.second_op is not None:
                series = calls.second_ops.get(rec.second_op) or self.metrics.second_op(
                    eng.label, calls, rec.second_op, label, rows_bucket_label(rows))
                series.observe(rec.broadcast_ns * 1e-9, exemplar)
            if rec.sample_ns or rank == 0:  # ranks that did not sample (gather mode, rank > 0) record 0
                calls.sample.observe(rec.sample_ns * 1e-9, exemplar)
            start, end = rec.start_ns, rec.end_ns
            path.observe((end - start) * 1e-9, exemplar)
            if start > max_start:
                max_start = start
            if end > max_end:
                max_end = end
            if min_start is None or start < min_start:
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
        for listener in self.call_listeners:
            listener(eng, call_index, mode, rows, critical)

    # -- discovery and engine restarts ------------------------------------------------------------------
    def _discover(self, now: int) -> None:
        try:
            found = discover_engines(self.shm_dir)
        except OSError:
            return
        if not found:
            return
        newest = found[0]
        if self.engine is not None and newest.engine_id == self.engine.engine_id:
            return
        try:
            attached = self._attach(newest, now)
        except Exception as exc:  # rings still being created, or foreign files: try again next time
            log.debug("cannot attach engine %016x yet: %s", newest.engine_id, exc)
            return
        if attached is None:
            return
        old, self.engine = self.engine, attached
        self.engines_seen += 1
        if old is not None:
            log.info("engine restart: %s -> %s", old.label, attached.label)
            self.metrics.forget_engine(old.label)
            for reader in old.readers:
                reader.close()
        else:
            log.info("attached engine %s (tp=%d)", attached.label, attached.tp_size)
        for listener in self.listeners:
            listener(old, attached)

    def _attach(self, files: EngineFiles, now: int) -> AttachedEngine | None:
        if 0 not in files.rings:
            return None
        with RingReader(files.rings[0]) as probe:
            tp = probe.header().tp_size
        if sorted(files.rings) != list(range(tp)):
            return None  # not every rank has created its ring yet
        readers = [RingReader(files.rings[r]) for r in range(tp)]
        headers = [r.header() for r in readers]
        if any(h.rank != i or h.engine_id != files.engine_id for i, h in enumerate(headers)):
            for r in readers:
                r.close()
            raise RingFormatError(f"rings in {files.dir} disagree on engine id or rank")
        h0 = headers[0]
        return AttachedEngine(files.engine_id, f"{files.engine_id:016x}", Path(files.dir), tp, h0.vocab, h0.dtype,
                              readers, now, headers, [0] * tp)

    # -- views for the collector and the API (called from other threads; read-only) --------------------
    def heartbeat_age_seconds(self, eng: AttachedEngine) -> float:
        """Seconds since the engine last finished a call (its newest record), or since attach if none yet."""
        return max(0.0, (self.clock() - (eng.last_record_end_ns or eng.attached_ns)) * 1e-9)

    def is_up(self, eng: AttachedEngine, age: float) -> bool:
        """Fresh heartbeat, and the engine has not closed its rings (a clean shutdown)."""
        return age < self.heartbeat_stale and not any(h.closed for h in eng.headers)

    def _refresh_headers(self, eng: AttachedEngine) -> None:
        """Read every rank's header now (scrapes and API calls; the poll loop does not parse headers it does not
        need). A reader closed by an engine switch meanwhile keeps the previous snapshot."""
        for rank, reader in enumerate(eng.readers):
            try:
                eng.headers[rank] = reader.header()
            except (ValueError, OSError):
                pass

    def counters(self) -> EngineCounters | None:
        eng = self.engine
        if eng is None:
            return None
        self._refresh_headers(eng)
        age = self.heartbeat_age_seconds(eng)
        ranks = [rank_counters(h, rank, eng.dropped[rank]) for rank, h in enumerate(eng.headers)]
        return EngineCounters(eng.label, self.is_up(eng, age), age, ranks)

    def info(self) -> EngineInfo:
        eng = self.engine
        if eng is None:
            return EngineInfo(attached=False)
        self._refresh_headers(eng)
        age = self.heartbeat_age_seconds(eng)
        return EngineInfo(True, eng.label, eng.tp_size, eng.vocab, eng.dtype, self.is_up(eng, age), age,
                          eng.records, sum(eng.dropped), eng.calls_joined, eng.calls_incomplete, len(eng.pending),
                          self.tracer.traces_started if self.tracer else 0)

