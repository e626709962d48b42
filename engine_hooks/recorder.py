"""RingRecorder: the engine side of the telemetry ring (one writer per rank; format in shm_format/ring.py).

record() runs once per logits call on every rank and costs about a microsecond: one pack_into of the record, a
few u64 counter updates in the header, one store of the write index. It never blocks and never waits for readers.
Stdlib only, so it is cheap to import and usable without torch.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time

from engine_hooks.shm_format import ring as fmt

_ALL_GATHER, _GATHER = 0, 1  # Mode codes; every other mode (sharded) has its own pair of ops
_ROW_WORDS = 1 + 2 * len(fmt.OPS)  # a counter row: calls, then (ns, bytes) per op
_ROW0 = fmt.COUNTERS_OFFSET // 8  # header word index of the first counter row
_WRITE_INDEX_WORD = fmt.WRITE_INDEX_OFFSET // 8
# word offsets inside a row: ns of an op at 1 + 2 * op, its bytes right after
_AG, _GA, _BC, _SA, _PA, _SX, _SR = (1 + 2 * op for op in (fmt.OP_ALL_GATHER, fmt.OP_GATHER, fmt.OP_BROADCAST,
                                                           fmt.OP_SAMPLE, fmt.OP_PATH, fmt.OP_SHARD_EXCHANGE,
                                                           fmt.OP_SHARD_RESOLVE))
_FIRST_OP = {_ALL_GATHER: _AG, _GATHER: _GA}  # sharded: _SX
_TOPP_ROWS_WORD = fmt.TOPP_ROWS_OFFSET // 8
_TOPP_FALLBACK_WORD = fmt.TOPP_FALLBACK_ROWS_OFFSET // 8


def _u32(value: int) -> int:
    return 0 if value < 0 else min(value, fmt.U32_MAX)


class RingRecorder:
    """Writes one record per call into `path` (created, truncated to size, memory-mapped)."""

    def __init__(self, path: str | os.PathLike, *, engine_id: int, rank: int, tp_size: int, vocab: int,
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
        self.dtype_code = fmt.dtype_code(dtype)
        size = fmt.ring_file_size(capacity)
        # Build the file under a temporary name and rename it into place: readers never see a blank header.
        tmp = f"{self.path}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._seq = 0
        fmt.HEADER_FIXED.pack_into(self._mm, 0, fmt.MAGIC, fmt.FORMAT_VERSION, fmt.HEADER_SIZE, fmt.RECORD_SIZE,
                                   capacity, engine_id, rank, tp_size, vocab, self.dtype_code, time.time_ns(),
                                   0, os.getpid(), fmt.STATE_OPEN, time.perf_counter_ns())
        os.replace(tmp, self.path)
        self._pack_record = fmt.RECORD.pack_into
        self._words = memoryview(self._mm)[: fmt.HEADER_SIZE].cast("Q")  # header as native u64 words

    @property
    def write_index(self) -> int:
        return self._seq

    def record(self, call_index: int, mode: int, rows: int, epoch: int, nbytes: int, t_start: int,
               coll_start: int, coll_end: int, bcast_start: int, bcast_end: int,
               sample_start: int, sample_end: int, t_end: int, *, resolve_nbytes: int = 0, topp_rows: int = 0,
               fallback_rows: int = 0) -> None:
        """One call. In gather mode the bcast marks time the token broadcast; in sharded mode they time the
        second collective (shard_resolve, `resolve_nbytes`), 0 when the call ran only one. `topp_rows` and
        `fallback_rows` count the call's top-p rows and those that took the full-row fallback (sharded mode).
        """
        seq = self._seq + 1
        coll_ns = coll_end - coll_start
        sample_ns = sample_end - sample_start
        path_ns = t_end - t_start
        if bcast_start:
            flags = fmt.FLAG_RESOLVE if mode > _GATHER else fmt.FLAG_BROADCAST
            bcast_off, bcast_ns = bcast_start - t_start, bcast_end - bcast_start
        else:
            flags = bcast_off = bcast_ns = 0
        if fallback_rows:
            flags |= min(fallback_rows, fmt.FALLBACK_MAX) << fmt.FALLBACK_SHIFT
        offset = fmt.HEADER_SIZE + ((seq - 1) % self.capacity) * fmt.RECORD_SIZE
        try:
            self._pack_record(self._mm, offset, seq, t_start, call_index, nbytes, epoch, rows, self.vocab, self.rank,
                              mode, self.dtype_code, coll_start - t_start, coll_ns, bcast_off, bcast_ns,
                              sample_start - t_start, sample_ns, path_ns, flags, seq)
        except struct.error:  # a duration beyond ~4.29 s or a clock running backwards: saturate, never raise
            coll_ns, bcast_ns, sample_ns, path_ns = (max(0, v) for v in (coll_ns, bcast_ns, sample_ns, path_ns))
            self._pack_record(self._mm, offset, seq, t_start, call_index, nbytes, epoch, rows, self.vocab, self.rank,
                              mode, self.dtype_code, *map(_u32, (coll_start - t_start, coll_ns, bcast_off, bcast_ns,
                                                                 sample_start - t_start, sample_ns, path_ns)),
                              flags, seq)
        # Counters: aligned u64 stores straight into the header (one store each, never torn).
        c = self._words
        base = _ROW0 + _ROW_WORDS * mode
        c[base] += 1
        k = base + _FIRST_OP.get(mode, _SX)
        c[k] += coll_ns
        c[k + 1] += nbytes
        if flags & fmt.FLAG_BROADCAST:
            bcast_bytes = (rows + 1) * fmt.BROADCAST_BYTES_PER_ROW
            c[base + _BC] += bcast_ns
            c[base + _BC + 1] += bcast_bytes
            nbytes += bcast_bytes
        elif flags & fmt.FLAG_RESOLVE:
            c[base + _SR] += bcast_ns
            c[base + _SR + 1] += resolve_nbytes
            nbytes += resolve_nbytes
        if topp_rows:
            c[_TOPP_ROWS_WORD] += topp_rows
            c[_TOPP_FALLBACK_WORD] += fallback_rows
        c[base + _SA] += sample_ns
        c[base + _PA] += path_ns
        c[base + _PA + 1] += nbytes
        c[_WRITE_INDEX_WORD] = seq  # publish last: readers trust every seq <= write_index
        self._seq = seq

    def close(self, unlink: bool = False) -> None:
        """Mark the ring closed and unmap it; unlink=True also removes the file. Idempotent."""
        if self._mm is not None:
            fmt.STATE.pack_into(self._mm, fmt.STATE_OFFSET, fmt.STATE_CLOSED)
            self._words.release()
            self._mm.close()
            self._mm = None
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
