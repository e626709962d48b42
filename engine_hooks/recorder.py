"""RingRecorder: the engine side of the telemetry ring (one writer per rank; format in shm_format/ring.py).

record() runs once per logits call on every rank and costs well under a microsecond: one pack_into of the
record, a few u64 counter updates in the header, one store of the write index. It never blocks and never waits
for readers. On CUDA the timings arrive calls later (gatherwise.engine_hooks.cuda_timing): count() puts the call's calls
and bytes into the header at the time of the call, record_timed() adds the record and the time counters once its
events completed, and drop() counts calls whose timings never will be — so the calls and bytes counters stay
exact whatever the device does. Stdlib only, so it is cheap to import and usable without torch."""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time

from gatherwise.engine_hooks.call_marks import MARKS, CallMarks
from gatherwise.logits_dtypes import dtype_code
from gatherwise.modes import Mode
from gatherwise.shm_format import ring as fmt
from gatherwise.shm_format.private_files import create_private_file, temporary_name

try:  # the compiled record() (engine_hooks/_ring_writer.c), built by pip install when a C compiler is there
    from gatherwise.engine_hooks import _ring_writer
except ImportError:
    _ring_writer = None  # type: ignore[assignment]  # mypy has no optional module; None: not built

_NATIVE_LAYOUT = ("FORMAT_VERSION", "HEADER_SIZE", "RECORD_SIZE", "WRITE_INDEX_OFFSET", "COUNTERS_OFFSET",
                  "NUM_MODE_ROWS", "TOPP_ROWS_OFFSET", "TAG_SHIFT")


def _native_modes() -> dict[str, object]:
    """What the compiled writer must agree on about the modes: their codes, each one's first op and the flag
    of its second operation (ring.MODE_OPS)."""
    return {"MODES": tuple((m.name, int(m)) for m in Mode),
            "MODE_FIRST_OPS": tuple(fmt.OPS.index(fmt.MODE_OPS[m][0]) for m in Mode),
            "MODE_SECOND_FLAGS": tuple(fmt.second_op_flag(m) for m in Mode)}


def _native_matches_format(native: object) -> bool:
    """The compiled writer hard-codes the ring layout, the modes and the order of the call marks; it may only
    write rings of the layout it was built for, from marks in the order it reads them."""
    return (all(getattr(native, k, None) == getattr(fmt, k) for k in _NATIVE_LAYOUT)
            and getattr(native, "NUM_OPS", None) == len(fmt.OPS)
            and all(getattr(native, k, None) == v for k, v in _native_modes().items())
            and getattr(native, "MARKS", None) == MARKS)


if _ring_writer is not None and not _native_matches_format(_ring_writer):
    # An in-place build of an older ring format (sources changed, `pip install` not redone) would write records
    # the reader misparses: use the Python writer and say why, once.
    print("gatherwise: gatherwise.engine_hooks._ring_writer was built for another ring format; using the Python "
          "record writer (reinstall gatherwise to rebuild it)", file=sys.stderr)
    _ring_writer = None  # type: ignore[assignment]  # as above

PURE_PYTHON_ENV = "GATHERWISE_PURE_PYTHON_RECORDER"  # "1": never use the compiled record()

_ROW_WORDS = 1 + 2 * len(fmt.OPS)  # a counter row: calls, then (ns, bytes) per op
_ROW0 = fmt.COUNTERS_OFFSET // fmt.WORD_BYTES  # header word index of the first counter row
_WRITE_INDEX_WORD = fmt.WRITE_INDEX_OFFSET // fmt.WORD_BYTES
_DROP0 = fmt.DROPS_OFFSET // fmt.WORD_BYTES
# word offsets inside a row: ns of an op at 1 + 2 * op, its bytes right after
_BC, _SA, _PA, _SR = (1 + 2 * op for op in (fmt.OP_BROADCAST, fmt.OP_SAMPLE, fmt.OP_PATH, fmt.OP_SHARD_RESOLVE))
_FIRST_OP = tuple(1 + 2 * fmt.OPS.index(fmt.MODE_OPS[m][0]) for m in Mode)  # by mode code
_SECOND_FLAG = tuple(fmt.second_op_flag(m) for m in Mode)  # by mode code
_TOPP_ROWS_WORD = fmt.TOPP_ROWS_OFFSET // fmt.WORD_BYTES
_TOPP_FALLBACK_WORD = fmt.TOPP_FALLBACK_ROWS_OFFSET // fmt.WORD_BYTES


def _flags(m: CallMarks) -> int:
    """Record flags: which second operation the second-operation fields time, the call's tag, the top-p
    fallback rows."""
    flags = _SECOND_FLAG[m.mode] if m.second_start else 0
    flags |= (m.tag & fmt.TAG_MASK) << fmt.TAG_SHIFT
    if m.fallback_rows:
        flags |= min(m.fallback_rows, fmt.FALLBACK_MAX) << fmt.FALLBACK_SHIFT
    return flags


def _spans(m: CallMarks) -> tuple[int, int, int, int, int, int, int]:
    """The record's seven u32 time fields, in ring.RECORD order: (collective offset, collective, second
    operation offset, second operation, sample offset, sample, path), offsets from t_start."""
    second_off, second_ns = (m.second_start - m.t_start, m.second_end - m.second_start) if m.second_start else (0, 0)
    return (m.coll_start - m.t_start, m.coll_end - m.coll_start, second_off, second_ns, m.sample_start - m.t_start,
            m.sample_end - m.sample_start, m.t_end - m.t_start)


def _u32(value: int) -> int:
    return 0 if value < 0 else min(value, fmt.U32_MAX)


class RingRecorder:
    """Writes one record per call into `path` (created, truncated to size, memory-mapped)."""

    def __init__(self, path: str | os.PathLike[str], *, engine_id: int, rank: int, tp_size: int, vocab: int,
                 dtype: object, capacity: int) -> None:
        if sys.byteorder != "little":  # the header counters are updated as native u64 words
            raise RuntimeError("the telemetry ring format is little-endian; this host is big-endian")
        if capacity < 1:
            raise ValueError(f"ring capacity must be >= 1, got {capacity}")
        if not 0 <= engine_id < 1 << 64:
            raise ValueError(f"engine_id must be an unsigned 64-bit integer, got {engine_id}")
        self.path = os.fspath(path)
        self.capacity = capacity
        self.rank, self.vocab = rank, vocab
        self.dtype_code = dtype_code(dtype)
        size = fmt.ring_file_size(capacity)
        # Build the file under a temporary name and rename it into place: readers never see a blank header.
        tmp = temporary_name(self.path)
        fd = create_private_file(tmp)  # 0600, never through a planted file or link
        try:
            # Reserve every page now: a mapped page of tmpfs is allocated at its first store, and a store the
            # filesystem has no room for raises SIGBUS, which would end this rank. posix_fallocate fails with
            # ENOSPC instead, here, where the caller can run without telemetry.
            os.posix_fallocate(fd, 0, size)
            self._mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        fmt.HEADER_FIXED.pack_into(self._mm, 0, fmt.MAGIC, fmt.FORMAT_VERSION, fmt.HEADER_SIZE, fmt.RECORD_SIZE,
                                   capacity, engine_id, rank, tp_size, vocab, self.dtype_code, time.time_ns(),
                                   0, os.getpid(), fmt.STATE_OPEN, time.perf_counter_ns())
        os.replace(tmp, self.path)
        self._pack_record = fmt.RECORD.pack_into
        self._words = memoryview(self._mm)[: fmt.HEADER_SIZE].cast("Q")  # header as native u64 words
        self._native = None
        if _ring_writer is not None and os.environ.get(PURE_PYTHON_ENV, "") in ("", "0"):
            self._native = _ring_writer.Writer(self._mm, capacity, vocab, rank, self.dtype_code, CallMarks)
            # the same bytes as the Python record() below, in one C call; an instance attribute on purpose, so the
            # hot path calls the C function directly (mypy flags any assignment to a method)
            self.record = self._native.record  # type: ignore[method-assign]

    @property
    def native(self) -> bool:
        """True when record() is the compiled writer."""
        return self._native is not None

    @property
    def write_index(self) -> int:
        return self._words[_WRITE_INDEX_WORD]

    def record(self, marks: CallMarks, /) -> None:
        """One call with its timings: the record, then all of its counters (the CPU path; one pass).

        In gather mode the second_* marks time the token broadcast; in sharded mode the second collective
        (shard_resolve, `resolve_nbytes` bytes), 0 when the call ran only one. `topp_rows` and `fallback_rows`
        count a sharded call's top-p rows and those that took the full-row fallback; `tag` says what the call
        sampled and the mode its table named (gatherwise.call_kind.call_tag)."""
        seq = self._words[_WRITE_INDEX_WORD] + 1  # the header is the one source (shared with the C writer)
        spans = _spans(marks)
        flags = _flags(marks)
        try:
            self._write_record(seq, marks, spans, flags)
        except struct.error:  # a duration beyond ~4.29 s or a clock running backwards: saturate, never raise
            self._write_record(seq, marks, tuple(map(_u32, spans)), flags)
        self._count_times(marks, spans, flags)
        self.count(marks)
        self._words[_WRITE_INDEX_WORD] = seq  # publish last: readers trust every seq <= write_index

    # -- split recording: count at call time, time later (gatherwise.engine_hooks.cuda_timing) -------------------
    def count(self, marks: CallMarks, /) -> None:
        """A call's calls and bytes counters, at the time of the call (before its timings are known: only
        whether its clock marks are 0 counts here). Counters are aligned u64 stores straight into the header
        (one store each, never torn; never pack_into, which zero-fills its span before writing it)."""
        c = self._words
        mode, nbytes = marks.mode, marks.nbytes
        base = _ROW0 + _ROW_WORDS * mode
        c[base] += 1
        c[base + _FIRST_OP[mode] + 1] += nbytes
        second_flag = _SECOND_FLAG[mode] if marks.second_start else 0
        if second_flag & fmt.FLAG_RESOLVE:
            c[base + _SR + 1] += marks.resolve_nbytes
            nbytes += marks.resolve_nbytes
        elif second_flag:
            bcast_bytes = fmt.broadcast_bytes(marks.rows)
            c[base + _BC + 1] += bcast_bytes
            nbytes += bcast_bytes
        if marks.topp_rows:
            c[_TOPP_ROWS_WORD] += marks.topp_rows
            c[_TOPP_FALLBACK_WORD] += marks.fallback_rows
        c[base + _PA + 1] += nbytes

    def record_timed(self, marks: CallMarks, /) -> None:
        """The record and the time counters of a call already count()ed (its clock marks now in ns)."""
        seq = self._words[_WRITE_INDEX_WORD] + 1  # the header is the one source (shared with the C writer)
        spans = _spans(marks)
        flags = _flags(marks)
        self._write_record(seq, marks, tuple(map(_u32, spans)), flags)
        self._count_times(marks, spans, flags)
        self._words[_WRITE_INDEX_WORD] = seq

    def _write_record(self, seq: int, m: CallMarks, spans: tuple[int, ...], flags: int) -> None:
        self._pack_record(self._mm, fmt.slot_offset(seq, self.capacity), seq, m.t_start, m.call_index, m.nbytes,
                          m.epoch, m.rows, self.vocab, self.rank, m.mode, self.dtype_code, *spans, flags, seq)

    def _count_times(self, m: CallMarks, spans: tuple[int, ...], flags: int) -> None:
        """The time counters of a call: its collective, second operation, sampling and path (negative spans,
        a clock running backwards, count as 0)."""
        c = self._words
        base = _ROW0 + _ROW_WORDS * m.mode
        c[base + _FIRST_OP[m.mode]] += max(0, spans[1])
        if flags & fmt.FLAG_BROADCAST:
            c[base + _BC] += max(0, spans[3])
        elif flags & fmt.FLAG_RESOLVE:
            c[base + _SR] += max(0, spans[3])
        c[base + _SA] += max(0, spans[5])
        c[base + _PA] += max(0, spans[6])

    def drop(self, reason: int, calls: int = 1) -> None:
        """Count calls whose timings will never be recorded (fmt.DROP_REASONS); they were count()ed."""
        self._words[_DROP0 + reason] += calls

    @staticmethod
    def _closed_record(marks: CallMarks, /) -> None:
        raise ValueError("record() on a closed ring")

    def close(self, unlink: bool = False) -> None:
        """Mark the ring closed and unmap it; unlink=True also removes the file. Idempotent."""
        if not self._mm.closed:
            fmt.STATE.pack_into(self._mm, fmt.STATE_OFFSET, fmt.STATE_CLOSED)
            if self._native is not None:
                self._native.release()
                self.record = self._closed_record  # type: ignore[method-assign]  # as in __init__
            self._words.release()
            self._mm.close()
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
