"""Ingest: shared-memory rings of the newest engine instance -> metrics, traces and the policy's samples.

The sidecar's schedule (gatherwise.sidecar.control.schedule) calls `poll_once()` when it expects a batch of records
while an engine is attached, and at each discovery deadline (`Poll.seconds_to_discovery`) while none is. Each poll reads
the new records of every rank (read-only mmaps: the engine never waits for it), joins them across ranks by call
index, and turns each call into histogram observations and, when sampled, a trace; the poll returns every
joined call (the policy's input: the schedule hands them on). A call is joined when the record of every rank read
here has arrived, or after a bounded delay (then it counts as incomplete and only its per-rank parts are
observed). The ranks read here are every rank of the group, or, on a node of a multi-node group, the ranks the
engine's node file names (gatherwise/shm_format/node_ranks.py); then the cross-rank figures are node-local and go
into families of their own, labelled with the node (gatherwise.sidecar.metrics.record_histograms). A new
engine instance id in shm_dir is an engine restart: ingest switches to it and drops the old instance's series, so
series never mix.

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

from gatherwise.modes import LABEL_OF_CODE, bucket_label, bucket_of
from gatherwise.shm_format.liveness import Liveness, is_removable, liveness
from gatherwise.shm_format.node_ranks import NodeRanks, read_node_ranks
from gatherwise.shm_format.private_files import check_shm_dir_for_reading
from gatherwise.shm_format.ring import CallRecord
from gatherwise.sidecar.ingest.attached_engine import AttachedEngine, EngineInfo, PendingCall
from gatherwise.sidecar.ingest.hooks_off import HooksOffWatch
from gatherwise.sidecar.ingest.joined_call import JoinedCall
from gatherwise.sidecar.ingest.ring_reader import EngineFiles, RingFormatError, RingReader, discover_engines
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
        self.remove_dead_dirs = remove_dead_dirs
        self._dir_cache: dict = {}  # discover_engines' per-directory cache
        self._dead: set[str] = set()  # directories whose engine is gone (it never comes back)
        self._unattachable: dict[str, EngineFiles] = {}  # directory -> its listing that did not attach
        self._no_locks: dict[str, EngineFiles] = {}  # directory -> its listing that had no liveness locks
        self._warned_dirs: set[str] = set()
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
            self._discover(now)
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
        label = LABEL_OF_CODE.get(mode)
        if label is None:  # a mode code no engine writes (the format allows 3): nothing sensible to show
            eng.calls_incomplete += 1
            return
        exemplar = None
        tracer = self.tracer
        if tracer is not None and tracer.should_sample(call_index):
            exemplar = {"trace_id": tracer.trace_call(eng.label, eng.tp_size, call_index, by_rank, complete,
                                                      root=0 in eng.ranks)}
        calls = eng.call_series.get((mode, bucket))
        if calls is None:
            calls = eng.call_series[(mode, bucket)] = self.histograms.call_series(
                eng.label, mode, bucket_label(bucket), eng.tp_node if eng.partial else None)
        rank_paths = eng.rank_path_series
        max_start = max_end = 0
        min_start = first.start_ns  # first is one of by_rank: the loop takes the minimum over every rank
        for rank, rec in by_rank.items():
            rank_path = rank_paths.get((rank, mode))
            if rank_path is None:
                rank_path = rank_paths[(rank, mode)] = self.histograms.rank_path_series(eng.label, str(rank), label)
            calls.first_op.observe(rec.collective_ns * 1e-9, exemplar)
            if rec.second_op is not None:
                series = calls.second_ops.get(rec.second_op) or self.histograms.second_op_series(
                    eng.label, calls, rec.second_op, label, bucket_label(bucket))
                series.observe(rec.second_ns * 1e-9, exemplar)
            if rec.sample_ns or rank == 0:  # ranks that did not sample (gather mode, rank > 0) record 0
                calls.sample.observe(rec.sample_ns * 1e-9, exemplar)
            start, end = rec.start_ns, rec.end_ns
            rank_path.observe((end - start) * 1e-9, exemplar)
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
        # Only a newer engine replaces the attached one: a dead engine's numbers stay (engine_up 0) until a new one
        # starts, and an older directory whose locks are held (a look-alike) is never switched to.
        since = current.headers[0].created_ns if current is not None and current.headers else None

        def older(files: EngineFiles) -> bool:
            return since is not None and current is not None and files.engine_id != current.engine_id \
                and files.created_ns <= since

        without_locks = []  # directories with no liveness locks: tried after every one whose lock is held
        for files in found:  # newest first
            state = self._state(files)  # (removes an exited engine's directory: older ones too)
            if state is Liveness.DEAD or older(files):
                continue
            if state is Liveness.UNKNOWN:
                without_locks.append(files)
                continue
            if self._attach_or_keep(files, current, now):
                return
            # A running engine's directory that does not attach yet is being built: list it again next time, for
            # a file added within the same tick of the (coarse) clock that dates directories leaves their mtime
            # as it was, and the cached listing would miss it for as long as nothing else changes there.
            self._dir_cache.pop(files.dir.name, None)
        for files in without_locks:
            if not older(files) and self._attach_or_keep(files, current, now):
                return

    def _attach_or_keep(self, files: EngineFiles, current: AttachedEngine | None, now: int) -> bool:
        """True when `files` is the attached engine (kept) or attaches now (switched to)."""
        if current is not None and files.engine_id == current.engine_id:
            if current.node is None and files.node_file is not None:  # attached before its node file was written
                node = self._node_ranks(files)
                if node is not None and node.ranks != current.ranks:
                    self._warn_dir(f"node:{files.dir}", f"engine {files.engine_id:016x}: its node file names TP "
                                   f"ranks {list(node.ranks)}, this sidecar reads {list(current.ranks)}; not used")
                else:
                    current.node = node
            return True  # the attached engine is still the newest one running
        attached = self._try_open_rings(files, now)
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
        if not files.rings and self._remove_if_empty(files):
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

    def _remove_if_empty(self, files: EngineFiles) -> bool:
        """An engine directory left empty for longer than liveness.EMPTY_DIR_GRACE_S (an engine killed while it
        made it) is removed like a dead one. Its listing does not change, so this is asked at every pass."""
        if not self.remove_dead_dirs:
            return False
        try:
            if liveness(files.dir) is not Liveness.UNKNOWN or not is_removable(files.dir):
                return False
            shutil.rmtree(files.dir)
        except OSError as exc:
            log.debug("cannot remove %s: %s", files.dir, exc)
            return False
        self._dead.add(files.dir.name)
        log.info("removed %s: an engine directory left empty", files.dir)
        return True

    def _try_open_rings(self, files: EngineFiles, now: int) -> AttachedEngine | None:
        name = files.dir.name
        if self._unattachable.get(name) is files:
            return None  # this very listing failed before: retry once the directory changes (new listing)
        try:
            attached = self._open_rings(files, now)
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
            old.replaced = True
            self.histograms.forget_engine(old.label)
            for reader in old.readers:
                reader.close()
        else:
            log.info("attached engine %s (tp=%d)", attached.label, attached.tp_size)

    def _warn_dir(self, key: str, message: str) -> None:
        if key not in self._warned_dirs:
            self._warned_dirs.add(key)
            log.warning(message)

    def _node_ranks(self, files: EngineFiles) -> NodeRanks | None:
        """The directory's node file; None without one, or for one that does not parse (never raises; said once)."""
        try:
            return read_node_ranks(files.dir) if files.node_file is not None else None
        except (OSError, ValueError) as exc:
            self._warn_dir(f"node:{files.dir}", f"engine {files.engine_id:016x}: node file not used: {exc}")
            return None

    def _open_rings(self, files: EngineFiles, now: int) -> AttachedEngine | None:
        """Attach once every rank of the group has its ring here, whatever the node file says, or, once the engine
        wrote the directory's node file, every rank that file names: a node of a multi-node group. Rings alone
        never attach a subset, so a single-node engine's directory is never read while still being built. A node
        file that the rings contradict is said once: it is written after every rank's ring, so it is damaged."""
        if not files.rings:
            return None
        node = self._node_ranks(files)
        ranks: tuple[int, ...] = ()
        if 0 in files.rings:
            with RingReader(files.rings[0]) as probe:
                tp = probe.header().tp_size
            if tuple(files.rings) == tuple(range(tp)):  # every rank of the group is here
                ranks = tuple(range(tp))
                if node is not None and node.ranks != ranks:
                    self._warn_dir(f"node:{files.dir}", f"engine {files.engine_id:016x}: its node file names TP "
                                   f"ranks {list(node.ranks)} but every rank's ring is here; reading every rank")
                    node = None
        if not ranks and node is not None:
            tp, ranks = node.tp_size, node.ranks
            if tuple(files.rings) != ranks:
                self._warn_dir(f"node:{files.dir}", f"engine {files.engine_id:016x}: its node file names TP ranks "
                               f"{list(node.ranks)}, the directory holds the rings of {list(files.rings)}; not read")
                return None
        if not ranks:
            return None  # not every rank has created its ring yet
        readers: list[RingReader] = []
        try:
            for rank in ranks:
                readers.append(RingReader(files.rings[rank], max_backlog=self.max_records_per_poll))
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        headers = [r.header() for r in readers]
        if any(h.rank != r or h.engine_id != files.engine_id or h.tp_size != tp
               for r, h in zip(ranks, headers, strict=True)):
            for reader in readers:
                reader.close()
            raise RingFormatError(f"rings in {files.dir} disagree on engine id, rank or TP size")
        h0 = headers[0]
        return AttachedEngine(files.engine_id, files.dir.name, Path(files.dir), tp, h0.vocab, h0.dtype, ranks,
                              readers, now, headers, node)

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

