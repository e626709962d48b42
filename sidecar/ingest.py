"""Ingest: shared-memory rings of the newest engine instance -> metrics, traces and the policy's samples.

The sidecar's loop (gatherwise.sidecar.controller) calls `poll_once()` when it expects a batch of records while an
engine is attached, and at each discovery deadline (`next_discovery_ns`) while none is. Each poll reads the new
records of every rank (read-only mmaps: the engine never waits for it), joins them across ranks by call index,
and turns each call into histogram observations and, when sampled, a trace; every joined call goes to
`on_call` (the policy's input). A call is joined when every rank's record has arrived, or after a bounded delay
(then it counts as incomplete and only its per-rank parts are observed). A new engine instance id in shm_dir is
an engine restart: ingest switches to it and drops the old instance's series, so series never mix.

Discovery is built for a directory other processes may litter: it tries engine directories newest first until
one attaches (an empty or half-built directory never hides a live engine; a directory without liveness locks,
however new, is tried only when no directory with a held lock attaches), skips what is not a real directory
or regular file (a FIFO never blocks the loop, a symlink is never followed), does not re-read directories that
did not change, and removes the directories of engines whose processes are gone (their liveness locks are free,
gatherwise/shm_format/liveness.py). One poll reads at most `max_records_per_poll` records per rank, and a
newly attached engine is read from at most that many records back, so a full ring of the largest allowed
capacity costs bounded time and memory per poll.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatherwise.sidecar.histograms import Series
from gatherwise.sidecar.hooks_off import HooksOffWatch
from gatherwise.sidecar.metrics import CallSeries, EngineCounters, SidecarMetrics, rank_counters
from gatherwise.sidecar.ring_reader import EngineFiles, RingFormatError, RingReader, discover_engines
from gatherwise.sidecar.traces import CallTracer

from gatherwise.modes import LABEL_OF_CODE, bucket_label, bucket_of
from gatherwise.shm_format.hooks_off import HooksOffNotice
from gatherwise.shm_format.liveness import Liveness, is_removable, liveness
from gatherwise.shm_format.private_files import check_shm_dir_for_reading

log = logging.getLogger("gatherwise.sidecar.ingest")

DEFAULT_MAX_RECORDS_PER_POLL = 16384  # sidecar.max_records_per_poll
# A joined call: (engine, call index, mode code, bucket, critical-path seconds, call tag: gatherwise.call_kind).
CallSink = Callable[["AttachedEngine", int, int, int, float, int], None]


@dataclass
class _Pending:
    first_seen_ns: int
    by_rank: dict[int, Any] = field(default_factory=dict)


@dataclass
class AttachedEngine:
    """The engine instance being ingested and what has been read from it so far: the sidecar's one record of the
    attached engine (its control side, gatherwise.sidecar.controller.EngineControl, refers to it)."""

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
    unreadable: dict[int, str] = field(default_factory=dict)  # rank -> why its ring is no longer read
    exited: bool = False  # its liveness locks were found free: every rank's process has ended
    last_record_end_ns: int = 0
    pending: dict[int, _Pending] = field(default_factory=dict)
    rank_paths: dict[tuple[int, int], Series] = field(default_factory=dict)  # (rank, mode)
    call_series: dict[tuple[int, int], CallSeries] = field(default_factory=dict)  # (mode, bucket)
    records: int = 0
    calls_joined: int = 0
    calls_incomplete: int = 0


@dataclass(frozen=True)
class EngineInfo:
    """What the sidecar knows of the attached engine and has ingested from it."""

    attached: bool
    shm_dir: str
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
    engines_seen: int = 0
    hooks_off: tuple[HooksOffNotice, ...] = ()  # engine processes whose hooks refused or never engaged


class Ingest:
    def __init__(self, shm_dir: str | Path, metrics: SidecarMetrics, tracer: CallTracer | None = None, *,
                 poll_interval: float = 0.02, join_timeout: float = 0.5, heartbeat_stale: float = 5.0,
                 discover_interval: float = 0.5, clock: Callable[[], int] = time.monotonic_ns,
                 max_records_per_poll: int = DEFAULT_MAX_RECORDS_PER_POLL, remove_dead_dirs: bool = True,
                 hooks_off: HooksOffWatch | None = None) -> None:
        if max_records_per_poll < 1:
            raise ValueError(f"max_records_per_poll must be >= 1, got {max_records_per_poll}")
        self.shm_dir = Path(shm_dir)
        self.hooks_off = hooks_off if hooks_off is not None else HooksOffWatch(shm_dir, remove_dead_dirs)
        self.max_records_per_poll = max_records_per_poll
        self.remove_dead_dirs = remove_dead_dirs
        self._dir_cache: dict = {}  # discover_engines' per-directory cache
        self._dead: set[str] = set()  # directories whose engine is gone (it never comes back)
        self._unattachable: dict[str, EngineFiles] = {}  # directory -> its listing that did not attach
        self._no_locks: dict[str, EngineFiles] = {}  # directory -> its listing that had no liveness locks
        self._warned_dirs: set[str] = set()
        self.metrics, self.tracer = metrics, tracer
        self.poll_interval = poll_interval
        self.join_timeout_ns = int(join_timeout * 1e9)
        self.heartbeat_stale = heartbeat_stale
        self.discover_interval_ns = int(discover_interval * 1e9)
        self.clock = clock
        self.engine: AttachedEngine | None = None
        self.engines_seen = 0
        self.on_call: CallSink | None = None  # the policy's input (gatherwise.sidecar.controller)
        self.next_discovery_ns = 0  # clock() value from which the next poll looks for engines
        metrics.header_collector._snapshot = self.counters

    # -- one iteration (on the sidecar's loop) -----------------------------------------------------------
    def poll_once(self) -> int:
        """Discover (when due), read every rank's new records, join and emit. Returns records read."""
        now = self.clock()
        if now >= self.next_discovery_ns:
            self.next_discovery_ns = now + self.discover_interval_ns
            self._discover(now)
        eng = self.engine
        if eng is None:
            return 0
        read = 0
        pending, tp = eng.pending, eng.tp_size
        for rank, reader in enumerate(eng.readers):
            if rank in eng.unreadable:
                continue
            try:
                records, missed = reader.read_new(self.max_records_per_poll, now)
            except (RingFormatError, OSError) as exc:  # truncated or replaced under us: stop reading this rank
                eng.unreadable[rank] = str(exc)
                log.warning("engine %s rank %d: ring no longer readable, its telemetry stops here: %s", eng.label,
                            rank, exc)
                continue
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
        mode, bucket = first.mode, bucket_of(max(first.rows, 1))  # the bucket of the call, for every consumer
        label = LABEL_OF_CODE.get(mode)
        if label is None:  # a mode code no engine writes (the format allows 3): nothing sensible to show
            eng.calls_incomplete += 1
            return
        exemplar = None
        tracer = self.tracer
        if tracer is not None and tracer.should_sample(call_index):
            exemplar = {"trace_id": tracer.trace_call(eng.label, eng.tp_size, call_index, by_rank, complete)}
        calls = eng.call_series.get((mode, bucket))
        if calls is None:
            calls = eng.call_series[(mode, bucket)] = self.metrics.call_series(eng.label, mode, bucket_label(bucket))
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
                    eng.label, calls, rec.second_op, label, bucket_label(bucket))
                series.observe(rec.second_ns * 1e-9, exemplar)
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
        if self.on_call is not None:
            self.on_call(eng, call_index, mode, bucket, critical, first.tag)

    # -- discovery and engine restarts ------------------------------------------------------------------
    def _discover(self, now: int) -> None:
        try:
            check_shm_dir_for_reading(self.shm_dir)
        except FileNotFoundError:
            return  # no engine has started yet
        except OSError as exc:  # another user's (or a world-writable) directory: its files could be anyone's
            self._warn_dir(str(self.shm_dir), f"not reading engines from {self.shm_dir}: {exc}")
            return
        self.hooks_off.scan()
        try:
            found = discover_engines(self.shm_dir, self._dir_cache)
        except OSError as exc:  # shm_dir unreadable (not ours): say so once, keep what is attached
            self._warn_dir(str(self.shm_dir), f"engine discovery in {self.shm_dir} failed: {exc}")
            return
        names = {files.dir.name for files in found}
        self._dead &= names
        for cache in (self._unattachable, self._no_locks):
            for name in set(cache) - names:
                del cache[name]
        current = self.engine
        without_locks = []  # directories with no liveness locks: tried after every one whose lock is held
        for files in found:  # newest first
            state = self._state(files)
            if state is Liveness.DEAD:
                continue
            if state is Liveness.UNKNOWN:
                without_locks.append(files)
                continue
            if self._attach_or_keep(files, current, now):
                return
        for files in without_locks:
            if self._attach_or_keep(files, current, now):
                return

    def _attach_or_keep(self, files: EngineFiles, current: AttachedEngine | None, now: int) -> bool:
        """True when `files` is the attached engine (kept) or attaches now (switched to)."""
        if current is not None and files.engine_id == current.engine_id:
            return True  # the attached engine is still the newest one running
        attached = self._try_attach(files, now)
        if attached is not None:
            self._switch(attached)
            return True
        return False

    def _state(self, files: EngineFiles) -> Liveness:
        """Whether the directory's engine runs (a liveness lock held), has exited (every lock free) or has no
        locks; removes the directories of exited engines when they are ours. The attached engine's readers keep
        their open files, so its last numbers remain."""
        name = files.dir.name
        if name in self._dead:
            return Liveness.DEAD
        if self._no_locks.get(name) is files:
            return Liveness.UNKNOWN  # no lock files in this very listing: a lock file appearing changes it
        try:
            state = liveness(files.dir)
        except OSError:
            return Liveness.DEAD  # removed meanwhile
        if state is Liveness.UNKNOWN:
            self._no_locks[name] = files
        if state is not Liveness.DEAD:
            return state
        self._dead.add(name)
        if self.engine is not None and self.engine.engine_id == files.engine_id:
            self.engine.exited = True
        if self.remove_dead_dirs:
            try:
                if is_removable(files.dir):
                    shutil.rmtree(files.dir)
                    log.info("removed %s: its engine exited without removing it", files.dir)
            except OSError as exc:
                log.debug("cannot remove %s: %s", files.dir, exc)
        return Liveness.DEAD

    def _try_attach(self, files: EngineFiles, now: int) -> AttachedEngine | None:
        name = files.dir.name
        if self._unattachable.get(name) is files:
            return None  # this very listing failed before: retry once the directory changes (new listing)
        try:
            attached = self._attach(files, now)
        except Exception as exc:  # rings still being created, or foreign files: try again when it changes
            log.debug("cannot attach engine %016x yet: %s", files.engine_id, exc)
            attached = None
        if attached is None:
            self._unattachable[name] = files
        else:
            self._unattachable.pop(name, None)
        return attached

    def _switch(self, attached: AttachedEngine) -> None:
        old, self.engine = self.engine, attached
        self.engines_seen += 1
        if old is not None:
            log.info("engine restart: %s -> %s", old.label, attached.label)
            self.metrics.forget_engine(old.label)
            for reader in old.readers:
                reader.close()
        else:
            log.info("attached engine %s (tp=%d)", attached.label, attached.tp_size)

    def _warn_dir(self, key: str, message: str) -> None:
        if key not in self._warned_dirs:
            self._warned_dirs.add(key)
            log.warning(message)

    def stopped_reason(self, eng: AttachedEngine) -> str | None:
        """Why the attached engine is not running any more, or None while it may be (a command still reaches
        it): it closed its rings, its processes are gone (liveness locks free), or its directory was removed."""
        if any(h.closed for h in eng.headers):
            return "it shut down (its rings are closed)"
        if eng.exited:
            return "its processes exited"
        try:
            state = liveness(eng.dir)
        except FileNotFoundError:
            return "its shared-memory directory was removed"
        except OSError:
            return None
        return "its processes exited" if state is Liveness.DEAD else None

    def _attach(self, files: EngineFiles, now: int) -> AttachedEngine | None:
        if 0 not in files.rings:
            return None
        with RingReader(files.rings[0]) as probe:
            tp = probe.header().tp_size
        if sorted(files.rings) != list(range(tp)):
            return None  # not every rank has created its ring yet
        readers = []
        try:
            for r in range(tp):
                readers.append(RingReader(files.rings[r], max_backlog=self.max_records_per_poll))
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        headers = [r.header() for r in readers]
        if any(h.rank != i or h.engine_id != files.engine_id for i, h in enumerate(headers)):
            for r in readers:
                r.close()
            raise RingFormatError(f"rings in {files.dir} disagree on engine id or rank")
        h0 = headers[0]
        return AttachedEngine(files.engine_id, files.dir.name, Path(files.dir), tp, h0.vocab, h0.dtype,
                              readers, now, headers, [0] * tp)

    # -- views for the header collector and GET /v1/engine (other threads; read-only, no policy state) -------
    def heartbeat_age_seconds(self, eng: AttachedEngine) -> float:
        """Seconds since the engine last finished a call (its newest record), or since attach if none yet."""
        return max(0.0, (self.clock() - (eng.last_record_end_ns or eng.attached_ns)) * 1e-9)

    def is_up(self, eng: AttachedEngine, age: float) -> bool:
        """Fresh heartbeat and no sign that the engine stopped (closed rings, exited processes, its directory
        removed). Asked at the moment of the scrape or API call: engines whose ranks exit without closing their
        rings remove the directory from their last process, which a discovery pass may not have seen yet."""
        return age < self.heartbeat_stale and self.stopped_reason(eng) is None

    def _refresh_headers(self, eng: AttachedEngine) -> None:
        """Read every rank's header now (scrapes and API calls; the poll loop does not parse headers it does not
        need). A reader closed by an engine switch meanwhile, or a ring no longer readable, keeps the previous
        snapshot."""
        for rank, reader in enumerate(eng.readers):
            if rank in eng.unreadable:
                continue
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
        ranks = [rank_counters(h, rank, {"overwritten": r.overwritten, "torn": r.torn, "invalid": r.invalid})
                 for rank, (h, r) in enumerate(zip(eng.headers, eng.readers, strict=True))]
        return EngineCounters(eng.label, self.is_up(eng, age), age, ranks)

    def info(self) -> EngineInfo:
        eng = self.engine
        if eng is None:
            return EngineInfo(attached=False, shm_dir=str(self.shm_dir), engines_seen=self.engines_seen,
                              hooks_off=self.hooks_off.notices)
        self._refresh_headers(eng)
        age = self.heartbeat_age_seconds(eng)
        return EngineInfo(True, str(self.shm_dir), eng.label, eng.tp_size, eng.vocab, eng.dtype, self.is_up(eng, age),
                          age, eng.records, sum(eng.dropped), eng.calls_joined, eng.calls_incomplete,
                          len(eng.pending), self.tracer.traces_started if self.tracer else 0, self.engines_seen,
                          self.hooks_off.notices)

