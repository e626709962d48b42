"""Read the per-rank telemetry rings an engine writes into shared memory (format: gatherwise/shm_format/ring.py).

Stdlib only — never torch. A reader opens the file read-only and copies what it needs with pread(): it can
neither block nor disturb the writer, and a file that someone truncates under it gives a RingTruncatedError,
never a SIGBUS (a read through a mapping beyond a file's end kills the reading process). It detects records
that were overwritten before it got to them or torn while it copied them, and counts them.

The file is trusted as much as its writer's user (who can write any byte of it), so nothing read from it may
make the sidecar lie: a record with a field out of its range (a mode no engine writes, no rows, another rank's or
vocab's record, a call index far beyond every call the header counted, an end in the future) is counted as
`invalid` and never exported, and a write index beyond the calls the header counted (a jump no writer makes)
counts the seqs it jumped over neither as overwritten nor as torn (reported once).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from gatherwise.shm_format import ring as fmt
from gatherwise.shm_format.liveness import is_engine_dir_name
from gatherwise.shm_format.node_ranks import NODE_NAME
from gatherwise.shm_format.private_files import open_regular_file
from gatherwise.shm_format.ring import CallRecord, RingHeader

log = logging.getLogger("gatherwise.sidecar.ingest")
_SNAPSHOT_TRIES = 4
# A record's end may lie this far past the reader's clock (CUDA timings are mapped onto the host clock, with a
# small error); later than that it comes from the future, i.e. it was not written by the engine.
FUTURE_TOLERANCE_NS = 1_000_000_000
# A record's call index lies below the calls its header counted (engines count calls from 0, and count a call
# before its record). This many beyond is still taken (writers that number their calls from elsewhere); further
# ahead a record would hold back everything that joins calls by index.
CALL_INDEX_LEAD = 1024
_MODES = frozenset(fmt.MODE_OPS)
_CALLS = slice(0, None, 1 + 2 * len(fmt.OPS))  # the calls word of every counter row


class RingFormatError(ValueError):
    """The file is not a gatherwise ring this reader understands (foreign, corrupt, other version)."""


class RingTruncatedError(RingFormatError):
    """The ring file became shorter than its header says while it was being read."""


class RingReader:
    """Reads one ring. start="oldest": every record still in the ring; start="now": only records written later.
    max_backlog: start at most this many records behind the newest (older ones are only in the counters)."""

    def __init__(self, path: str | os.PathLike, *, start: str = "oldest", max_backlog: int | None = None) -> None:
        if start not in ("oldest", "now"):
            raise ValueError(f"start must be 'oldest' or 'now', got {start!r}")
        self.path = os.fspath(path)
        # no symlink, no FIFO, no file of another owner than its directory's: UnsafePathError
        self._fd: int | None = open_regular_file(self.path, owner_of_dir=True)
        try:
            size = os.fstat(self._fd).st_size
            if size < fmt.HEADER_SIZE:
                raise RingFormatError(f"{self.path}: {size} bytes is too small for a gatherwise ring "
                                      f"(header alone is {fmt.HEADER_SIZE} bytes)")
            self._validate(size)
            first = self.header()
        except BaseException:
            self.close()
            raise
        self.engine_id, self.rank, self.capacity = first.engine_id, first.rank, first.capacity
        self.dtype = first.dtype
        self._end = fmt.HEADER_SIZE + self.capacity * fmt.RECORD_SIZE
        w = first.write_index
        self.cursor = w if start == "now" else max(0, w - self.capacity + 1)  # last seq consumed
        if max_backlog is not None:
            self.cursor = max(self.cursor, w - max_backlog)
        self.vocab = first.vocab
        self.overwritten = 0  # records lost because the writer lapped this reader
        self.torn = 0  # records whose two sequence numbers disagreed with their slot
        self.invalid = 0  # records with a field out of its range (see the module docstring)
        # A writer counts a call before it publishes the call's record, so its write index never exceeds the
        # calls counted: what the index holds beyond them was written by something else (a jump).
        self._excess = max(0, w - sum(c.calls for c in first.counters.values()))
        self._last_call_index = -1  # call index of the newest valid record
        self.index_jumped = 0  # seqs the write index skipped that no record ever had (not a drop)
        self._never_written = 0  # of those, seqs not yet met (lapped over, or read as a stale slot)
        self._warned_jump = False

    def _pread(self, size: int, offset: int) -> bytes:
        if self._fd is None:
            raise RingTruncatedError(f"{self.path}: reader is closed")
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise RingTruncatedError(f"{self.path}: file shrank below {offset + size} bytes while being read "
                                     f"(truncated or replaced by another process)")
        return data

    def _validate(self, size: int) -> None:
        (magic, version, header_size, record_size, capacity, *_rest) = fmt.HEADER_FIXED.unpack(
            self._pread(fmt.HEADER_FIXED.size, 0))
        if magic != fmt.MAGIC:
            raise RingFormatError(f"{self.path}: not a gatherwise ring (magic {magic!r}, expected {fmt.MAGIC!r})")
        if version != fmt.FORMAT_VERSION:
            raise RingFormatError(f"{self.path}: ring format version {version}, this reader understands only "
                                  f"version {fmt.FORMAT_VERSION}; upgrade the older side")
        if header_size != fmt.HEADER_SIZE or record_size != fmt.RECORD_SIZE:
            raise RingFormatError(f"{self.path}: header/record size {header_size}/{record_size}, expected "
                                  f"{fmt.HEADER_SIZE}/{fmt.RECORD_SIZE} for version {version}")
        if capacity < 1 or size != fmt.ring_file_size(capacity):
            raise RingFormatError(f"{self.path}: file is {size} bytes but the header says capacity {capacity} "
                                  f"({fmt.ring_file_size(capacity)} bytes): truncated or corrupt")

    def _write_index(self) -> int:
        return fmt.WRITE_INDEX.unpack(self._pread(fmt.WRITE_INDEX.size, fmt.WRITE_INDEX_OFFSET))[0]

    def _calls_counted(self) -> int:
        """Calls the header counts, every mode: the writer counts a call before it publishes its record."""
        return sum(fmt.COUNTERS.unpack(self._pread(fmt.COUNTERS.size, fmt.COUNTERS_OFFSET))[_CALLS])

    def header(self) -> RingHeader:
        """A consistent snapshot of the header and counters (read twice until both copies agree)."""
        raw = self._pread(fmt.HEADER_SIZE, 0)
        for _ in range(_SNAPSHOT_TRIES):
            again = self._pread(fmt.HEADER_SIZE, 0)
            if again == raw:
                break
            raw = again
        (_magic, version, _hs, record_size, capacity, engine_id, rank, tp_size, vocab, dtype, created_ns,
         write_index, pid, state, created_mono_ns) = fmt.HEADER_FIXED.unpack_from(raw, 0)
        counters = fmt.counters_from_values(fmt.COUNTERS.unpack_from(raw, fmt.COUNTERS_OFFSET))
        drops = dict(zip(fmt.DROP_REASONS, fmt.DROPS.unpack_from(raw, fmt.DROPS_OFFSET), strict=True))
        topp_rows, topp_fallback_rows = fmt.TOPP_COUNTERS.unpack_from(raw, fmt.TOPP_ROWS_OFFSET)
        return RingHeader(version, engine_id, rank, tp_size, vocab, fmt.dtype_name(dtype), record_size, capacity,
                          created_ns, created_mono_ns, write_index, pid, state == fmt.STATE_CLOSED, counters, drops,
                          topp_rows, topp_fallback_rows)

    def read_new(self, max_records: int | None = None, now_ns: int | None = None) -> tuple[list[CallRecord], int]:
        """Records written since the last call (at most max_records), and how many were missed meanwhile.
        `now_ns`: the reader's monotonic clock now (records ending later are invalid); time.monotonic_ns()."""
        cap = self.capacity
        w = self._write_index()
        calls = self._calls_counted()  # after the index: it counts at least every record up to w
        if w < self.cursor:  # cannot happen with one writer per file; resynchronise rather than loop
            self.cursor = max(0, w - cap)
        first = self.cursor + 1
        excess = max(0, w - calls)
        if excess > self._excess:  # the index jumped since the last read: that many seqs were never written
            jump = min(excess - self._excess, max(0, w - self.cursor))
            self._report_jump(jump)
            self._never_written += jump
        self._excess = excess
        # Readable: seqs w - cap + 2 .. w. The slot of w - cap + 1 is the one the writer fills next (seq w + 1).
        lapped = max(0, (w - cap + 2) - first)
        missed = lapped - self._explain(lapped)  # a seq never written was never overwritten either
        first += lapped
        last = w if max_records is None else min(w, first + max_records - 1)
        if first > last:
            self.overwritten += missed
            self.cursor = max(self.cursor, first - 1)
            self._never_written = 0
            return [], missed
        n = last - first + 1
        slot, begin = fmt.slot_of(first, cap), fmt.slot_offset(first, cap)
        if slot + n <= cap:
            data = self._pread(n * fmt.RECORD_SIZE, begin)
        else:
            data = (self._pread(self._end - begin, begin)
                    + self._pread((slot + n - cap) * fmt.RECORD_SIZE, fmt.HEADER_SIZE))
        # The writer may by now be writing seq w2 + 1, whose slot held seq w2 + 1 - cap: anything at or below
        # that seq may have changed under the copy, so it counts as overwritten (none if w2 == w).
        stale = min(n, max(0, self._write_index() + 2 - cap - first))
        self.overwritten += missed + stale
        records, torn = _decode(data, first, stale)
        torn -= self._explain(torn)  # a slot the jump skipped holds an older seq: no record of it was torn
        self.torn += torn
        records, invalid = self._valid(records, calls, time.monotonic_ns() if now_ns is None else now_ns)
        self.invalid += invalid
        self.cursor = last
        self._never_written = 0  # met by now (a later read starts past them)
        return records, missed + stale + torn + invalid

    def _valid(self, records: list[CallRecord], calls: int, now_ns: int) -> tuple[list[CallRecord], int]:
        """The records whose every field is in its range, and how many were not."""
        horizon = now_ns + FUTURE_TOLERANCE_NS
        lead = calls + CALL_INDEX_LEAD
        rank, vocab = self.rank, self.vocab
        prev = self._last_call_index
        kept = []
        for rec in records:
            ci = rec.call_index
            if (rec.mode in _MODES and rec.rows >= 1 and rec.rank == rank and rec.vocab == vocab
                    and rec.end_ns <= horizon and (ci == prev + 1 or ci < lead)):
                kept.append(rec)
                prev = max(prev, ci)
        self._last_call_index = prev
        return kept, len(records) - len(kept)

    def _explain(self, seqs: int) -> int:
        """How many of `seqs` unreadable seqs are ones the index jumped over (and are then accounted for)."""
        explained = min(seqs, self._never_written)
        self._never_written -= explained
        return explained

    def _report_jump(self, jump: int) -> None:
        self.index_jumped += jump
        if not self._warned_jump:
            self._warned_jump = True
            log.warning("%s: write index jumped %d records beyond the calls its header counted (written by another "
                        "process?); those records never existed and are not counted as dropped", self.path, jump)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SECOND_OP = fmt.FLAG_BROADCAST | fmt.FLAG_RESOLVE
_TAG_SHIFT, _TAG_MASK = fmt.TAG_SHIFT, fmt.TAG_MASK


def _decode(data: bytes, first_seq: int, skip: int) -> tuple[list[CallRecord], int]:
    """Unpack a run of records starting at first_seq; drop the first `skip` and any whose seqs disagree."""
    names = fmt.DTYPE_NAMES
    out: list[CallRecord] = []
    append = out.append
    torn = 0
    expected = first_seq
    for (seq, start, call_index, nbytes, epoch, rows, vocab, rank, mode, dtype, coll_off, coll_ns, second_off,
         second_ns, sample_off, sample_ns, path_ns, flags, seq_end) in fmt.RECORD.iter_unpack(data):
        if skip:
            skip -= 1
        elif seq != expected or seq_end != expected:
            torn += 1
        else:
            append(CallRecord(seq, call_index, mode, rows, vocab, names.get(dtype) or fmt.dtype_name(dtype), rank,
                              epoch, nbytes, start, start + coll_off, coll_ns,
                              start + second_off if flags & _SECOND_OP else 0, second_ns,
                              start + sample_off, sample_ns, start + path_ns, fmt.second_op_of(flags),
                              flags >> fmt.FALLBACK_SHIFT, (flags >> _TAG_SHIFT) & _TAG_MASK))
        expected += 1
    return out, torn


@dataclass(frozen=True)
class EngineFiles:
    engine_id: int
    dir: Path
    rings: dict[int, Path] = field(default_factory=dict)  # rank -> ring file, in rank order
    control: Path | None = None
    created_ns: int = 0  # from the lowest rank's ring header, else the directory's mtime
    node_file: Path | None = None  # which ranks the directory holds, once it is complete (shm_format/node_ranks.py)


def discover_engines(shm_dir: str | os.PathLike[str],
                     cache: dict[str, tuple[tuple[int, int], EngineFiles]] | None = None) -> list[EngineFiles]:
    """Engine instances under shm_dir (directories named by a 16-hex-digit id), newest first.

    Only real directories and regular files count: a symlink, a FIFO or a device in their place is skipped, so
    discovery never follows a link out of shm_dir and never blocks. `cache` (kept by the caller between calls)
    maps a directory name to what was found there, keyed by the directory's inode and mtime: a directory whose
    entries did not change is not read again, so many leftover directories cost one stat each per discovery.
    """
    try:
        entries = list(os.scandir(shm_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    seen = set()
    for entry in entries:
        if not is_engine_dir_name(entry.name):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        key = (st.st_ino, st.st_mtime_ns)
        seen.add(entry.name)
        hit = cache.get(entry.name) if cache is not None else None
        if hit is not None and hit[0] == key:
            found.append(hit[1])
            continue
        try:
            files = _engine_files(Path(entry.path), int(entry.name, 16), st.st_mtime_ns)
        except OSError:
            continue  # removed while we looked
        if cache is not None:
            cache[entry.name] = (key, files)
        found.append(files)
    if cache is not None:
        for name in set(cache) - seen:
            del cache[name]
    found.sort(key=lambda e: e.created_ns, reverse=True)
    return found


def _engine_files(directory: Path, engine_id: int, mtime_ns: int) -> EngineFiles:
    rings = {}
    control = node_file = None
    with os.scandir(directory) as it:
        for f in it:
            if not f.is_file(follow_symlinks=False):  # regular files only: no links, FIFOs, devices
                continue
            if f.name == fmt.CONTROL_NAME:
                control = Path(f.path)
            elif f.name == NODE_NAME:
                node_file = Path(f.path)
            elif f.name.startswith(fmt.RING_PREFIX) and f.name[len(fmt.RING_PREFIX):].isdigit():
                rings[int(f.name[len(fmt.RING_PREFIX):])] = Path(f.path)
    rings = dict(sorted(rings.items()))
    return EngineFiles(engine_id, directory, rings, control, _created_ns(rings) or mtime_ns, node_file)


def _created_ns(rings: dict[int, Path]) -> int:
    """Creation time from the first readable ring header (one small pread, no mapping), else 0."""
    for path in rings.values():
        try:
            fd = open_regular_file(path)
        except OSError:
            continue
        try:
            raw = os.pread(fd, fmt.HEADER_FIXED.size, 0)
        finally:
            os.close(fd)
        if len(raw) == fmt.HEADER_FIXED.size:
            fields = fmt.HEADER_FIXED.unpack(raw)
            if fields[0] == fmt.MAGIC:
                return fields[10]
    return 0
