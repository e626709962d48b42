"""Read the per-rank telemetry rings an engine writes into shared memory (format: engine_hooks/shm_format/ring.py).

Stdlib only — never torch. A reader maps the file read-only, so it can neither block nor disturb the writer;
it detects records that were overwritten before it got to them or torn while it copied them, and counts them.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine_hooks.shm_format import ring as fmt
from engine_hooks.shm_format.ring import CallRecord, RingHeader

_SNAPSHOT_TRIES = 4


class RingFormatError(ValueError):
    """The file is not a gatherwise ring this reader understands (foreign, corrupt, other version)."""


class RingReader:
    """Reads one ring. start="oldest": every record still in the ring; start="now": only records written later."""

    def __init__(self, path: str | os.PathLike, *, start: str = "oldest") -> None:
        if start not in ("oldest", "now"):
            raise ValueError(f"start must be 'oldest' or 'now', got {start!r}")
        self.path = os.fspath(path)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < fmt.HEADER_SIZE:
                raise RingFormatError(f"{self.path}: {size} bytes is too small for a gatherwise ring "
                                      f"(header alone is {fmt.HEADER_SIZE} bytes)")
            self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            self._validate(size)
        except RingFormatError:
            self._mm.close()
            raise
        first = self.header()
        self.engine_id, self.rank, self.capacity = first.engine_id, first.rank, first.capacity
        self.dtype = first.dtype
        self._end = fmt.HEADER_SIZE + self.capacity * fmt.RECORD_SIZE
        w = first.write_index
        self.cursor = w if start == "now" else max(0, w - self.capacity + 1)  # last seq consumed
        self.overwritten = 0  # records lost because the writer lapped this reader
        self.torn = 0  # records whose two sequence numbers disagreed with their slot

    def _validate(self, size: int) -> None:
        (magic, version, header_size, record_size, capacity, *_rest) = fmt.HEADER_FIXED.unpack_from(self._mm, 0)
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
        return fmt.WRITE_INDEX.unpack_from(self._mm, fmt.WRITE_INDEX_OFFSET)[0]

    def header(self) -> RingHeader:
        """A consistent snapshot of the header and counters (read twice until both copies agree)."""
        raw = self._mm[: fmt.HEADER_SIZE]
        for _ in range(_SNAPSHOT_TRIES):
            again = self._mm[: fmt.HEADER_SIZE]
            if again == raw:
                break
            raw = again
        (_magic, version, _hs, record_size, capacity, engine_id, rank, tp_size, vocab, dtype, created_ns,
         write_index, pid, state, created_mono_ns) = fmt.HEADER_FIXED.unpack_from(raw, 0)
        counters = fmt.counters_from_values(fmt.COUNTERS.unpack_from(raw, fmt.COUNTERS_OFFSET))
        topp_rows, topp_fallback_rows = fmt.TOPP_COUNTERS.unpack_from(raw, fmt.TOPP_ROWS_OFFSET)
        return RingHeader(version, engine_id, rank, tp_size, vocab, fmt.dtype_name(dtype), record_size, capacity,
                          created_ns, created_mono_ns, write_index, pid, state == fmt.STATE_CLOSED, counters,
                          topp_rows, topp_fallback_rows)

    def read_new(self, max_records: int | None = None) -> tuple[list[CallRecord], int]:
        """Records written since the last call (at most max_records), and how many were missed meanwhile."""
        cap = self.capacity
        w = self._write_index()
        if w < self.cursor:  # cannot happen with one writer per file; resynchronise rather than loop
            self.cursor = max(0, w - cap)
        first = self.cursor + 1
        # Readable: seqs w - cap + 2 .. w. The slot of w - cap + 1 is the one the writer fills next (seq w + 1).
        missed = max(0, (w - cap + 2) - first)
        first += missed
        last = w if max_records is None else min(w, first + max_records - 1)
        if first > last:
            self.overwritten += missed
            return [], missed
        n = last - first + 1
        slot = (first - 1) % cap
        begin = fmt.HEADER_SIZE + slot * fmt.RECORD_SIZE
        if slot + n <= cap:
            data = self._mm[begin: begin + n * fmt.RECORD_SIZE]
        else:
            data = self._mm[begin: self._end] + self._mm[fmt.HEADER_SIZE: fmt.HEADER_SIZE + (slot + n - cap) *
                                                        fmt.RECORD_SIZE]
        # The writer may by now be writing seq w2 + 1, whose slot held seq w2 + 1 - cap: anything at or below
        # that seq may have changed under the copy, so it counts as overwritten (none if w2 == w).
        stale = min(n, max(0, self._write_index() + 2 - cap - first))
        self.overwritten += missed + stale
        records, torn = _decode(data, first, stale)
        self.torn += torn
        self.cursor = last
        return records, missed + stale + torn

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def __enter__(self) -> RingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SECOND_OP = fmt.FLAG_BROADCAST | fmt.FLAG_RESOLVE


def _decode(data: bytes, first_seq: int, skip: int) -> tuple[list[CallRecord], int]:
    """Unpack a run of records starting at first_seq; drop the first `skip` and any whose seqs disagree."""
    names = fmt.DTYPE_NAMES
    out = []
    append = out.append
    torn = 0
    expected = first_seq
    for (seq, start, call_index, nbytes, epoch, rows, vocab, rank, mode, dtype, coll_off, coll_ns, bcast_off,
         bcast_ns, sample_off, sample_ns, path_ns, flags, seq_end) in fmt.RECORD.iter_unpack(data):
        if skip:
            skip -= 1
        elif seq != expected or seq_end != expected:
            torn += 1
        else:
            append(CallRecord(seq, call_index, mode, rows, vocab, names.get(dtype) or fmt.dtype_name(dtype), rank,
                              epoch, nbytes, start, start + coll_off, coll_ns,
                              start + bcast_off if flags & _SECOND_OP else 0, bcast_ns,
                              start + sample_off, sample_ns, start + path_ns, fmt.second_op_of(flags),
                              flags >> fmt.FALLBACK_SHIFT))
        expected += 1
    return out, torn


@dataclass(frozen=True)
class EngineFiles:
    engine_id: int
    dir: Path
    rings: dict[int, Path] = field(default_factory=dict)  # rank -> ring file, in rank order
    control: Path | None = None
    created_ns: int = 0  # from the lowest rank's ring header, else the directory's mtime


def writer_alive(pid: int) -> bool:
    """Whether the process that wrote a ring still exists (on this host)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def discover_engines(shm_dir: str | os.PathLike) -> list[EngineFiles]:
    """Engine instances under shm_dir (directories named by a 16-hex-digit id), newest first."""
    root = Path(shm_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        if len(entry.name) != 16 or not entry.is_dir():
            continue
        try:
            engine_id = int(entry.name, 16)
        except ValueError:
            continue
        rings = {}
        for f in entry.glob(f"{fmt.RING_PREFIX}*"):
            suffix = f.name[len(fmt.RING_PREFIX):]
            if suffix.isdigit():
                rings[int(suffix)] = f
        rings = dict(sorted(rings.items()))
        control = entry / fmt.CONTROL_NAME
        found.append(EngineFiles(engine_id, entry, rings, control if control.exists() else None,
                                 _created_ns(entry, rings)))
    found.sort(key=lambda e: e.created_ns, reverse=True)
    return found


def _created_ns(directory: Path, rings: dict[int, Path]) -> int:
    for path in rings.values():
        try:
            with RingReader(path) as reader:
                return reader.header().created_ns
        except (OSError, RingFormatError):
            continue
    try:
        return directory.stat().st_mtime_ns
    except OSError:
        return 0
