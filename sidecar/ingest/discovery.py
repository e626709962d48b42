"""Discovery: which engine in shm_dir the sidecar reads, its rings opened when it attaches.

Discovery is built for a directory other processes may litter: it tries engine directories newest first until
one attaches (an empty or half-built directory never hides a live engine; a directory without liveness locks,
however new, is tried only when no directory with a held lock attaches), skips what is not a real directory
or regular file (a FIFO never blocks the loop, a symlink is never followed), does not re-read directories that
did not change, and removes the directories of engines whose processes are gone (their liveness locks are free,
gatherwise/shm_format/liveness.py). A newly attached engine is read from at most `max_backlog` records back, so a
full ring of the largest allowed capacity costs bounded time and memory per poll.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from gatherwise.shm_format.liveness import Liveness, is_removable, liveness
from gatherwise.shm_format.node_ranks import NodeRanks, read_node_ranks
from gatherwise.shm_format.private_files import check_shm_dir_for_reading
from gatherwise.sidecar.ingest.attached_engine import AttachedEngine
from gatherwise.sidecar.ingest.hooks_off import HooksOffWatch
from gatherwise.sidecar.ingest.ring_reader import EngineFiles, RingFormatError, RingReader, discover_engines

log = logging.getLogger("gatherwise.sidecar.ingest")


class Discovery:
    def __init__(self, shm_dir: Path, hooks_off: HooksOffWatch, *, max_backlog: int,
                 remove_dead_dirs: bool = True) -> None:
        """`hooks_off` is re-read at each pass (the same watch feeds /metrics and /readyz)."""
        self.shm_dir, self.hooks_off = shm_dir, hooks_off
        self.max_backlog = max_backlog
        self.remove_dead_dirs = remove_dead_dirs
        self._dir_cache: dict[str, tuple[tuple[int, int], EngineFiles]] = {}  # discover_engines' listings
        self._dead: set[str] = set()  # directories whose engine is gone (it never comes back)
        self._unattachable: dict[str, EngineFiles] = {}  # directory -> its listing that did not attach
        self._no_locks: dict[str, EngineFiles] = {}  # directory -> its listing that had no liveness locks
        self._warned_dirs: set[str] = set()

    def newer_engine(self, current: AttachedEngine | None, now: int) -> AttachedEngine | None:
        """One pass over shm_dir: a newer running engine than `current`, its rings opened (the caller switches to
        it), or None while `current` is still the one to read (what the pass learnt of it, its node file or that
        its processes exited, is noted on it)."""
        found = self._pass(current, now)
        return None if found is current else found

    def _pass(self, current: AttachedEngine | None, now: int) -> AttachedEngine | None:
        """The engine to read after this pass: `current` kept, a newer one attached, or None (neither)."""
        try:
            check_shm_dir_for_reading(self.shm_dir)
        except FileNotFoundError:
            return current  # no engine has started yet
        except OSError as exc:  # another user's (or a world-writable) directory: its files could be anyone's
            self._warn_dir(str(self.shm_dir), f"not reading engines from {self.shm_dir}: {exc}")
            return current
        self.hooks_off.scan()
        try:
            found = discover_engines(self.shm_dir, self._dir_cache)
        except OSError as exc:  # shm_dir unreadable (not ours): say so once, keep what is attached
            self._warn_dir(str(self.shm_dir), f"engine discovery in {self.shm_dir} failed: {exc}")
            return current
        names = {files.dir.name for files in found}
        self._dead &= names
        for cache in (self._unattachable, self._no_locks):
            for name in set(cache) - names:
                del cache[name]
        # Only a newer engine replaces the attached one: a dead engine's numbers stay (engine_up 0) until a new one
        # starts, and an older directory whose locks are held (a look-alike) is never switched to.
        since = current.headers[0].created_ns if current is not None and current.headers else None

        def older(files: EngineFiles) -> bool:
            return since is not None and current is not None and files.engine_id != current.engine_id \
                and files.created_ns <= since

        without_locks = []  # directories with no liveness locks: tried after every one whose lock is held
        for files in found:  # newest first
            state = self._state(files, current)  # (removes an exited engine's directory: older ones too)
            if state is Liveness.DEAD or older(files):
                continue
            if state is Liveness.UNKNOWN:
                without_locks.append(files)
                continue
            engine = self._attach_or_keep(files, current, now)
            if engine is not None:
                return engine
            # A running engine's directory that does not attach yet is being built: list it again next time, for
            # a file added within the same tick of the (coarse) clock that dates directories leaves their mtime
            # as it was, and the cached listing would miss it for as long as nothing else changes there.
            self._dir_cache.pop(files.dir.name, None)
        for files in without_locks:
            engine = None if older(files) else self._attach_or_keep(files, current, now)
            if engine is not None:
                return engine
        return current

    def _attach_or_keep(self, files: EngineFiles, current: AttachedEngine | None, now: int) -> AttachedEngine | None:
        """`current` when `files` is its directory (kept), the engine of `files` when it attaches now, else None."""
        if current is not None and files.engine_id == current.engine_id:
            if current.node is None and files.node_file is not None:  # attached before its node file was written
                node = self._node_ranks(files)
                if node is not None and node.ranks != current.ranks:
                    self._warn_dir(f"node:{files.dir}", f"engine {files.engine_id:016x}: its node file names TP "
                                   f"ranks {list(node.ranks)}, this sidecar reads {list(current.ranks)}; not used")
                else:
                    current.node = node
            return current  # the attached engine is still the newest one running
        return self._try_open_rings(files, now)

    def _state(self, files: EngineFiles, current: AttachedEngine | None) -> Liveness:
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
        if current is not None and current.engine_id == files.engine_id:
            current.exited = True
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
                readers.append(RingReader(files.rings[rank], max_backlog=self.max_backlog))
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
