"""RingRecorder: the engine side of the telemetry ring (one writer per rank; format in shm_format/ring.py).

record() runs once per logits call on every rank and costs about a microsecond: one pack_into of the record,
one of the mode's counter row, one of the write index. It never blocks and never waits for readers.
Stdlib only, so it is cheap to import and usable without torch.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

from engine_hooks.shm_format import ring as fmt

_ALL_GATHER = 0  # Mode.ALL_GATHER; the collective op of every other mode is gather
assert fmt.OPS == ("all_gather", "gather", "broadcast", "sample", "path")  # record() indexes rows by this order


def _u32(value: int) -> int:
    return 0 if value < 0 else min(value, fmt.U32_MAX)


class RingRecorder:
    """Writes one record per call into `path` (created, truncated to size, memory-mapped)."""

    def __init__(self, path: str | os.PathLike, *, engine_id: int, rank: int, tp_size: int, vocab: int,
                 dtype: object, capacity: int) -> None:
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
        self._rows = [[0] * (1 + 2 * len(fmt.OPS)) for _ in range(fmt.NUM_MODE_ROWS)]
        fmt.HEADER_FIXED.pack_into(self._mm, 0, fmt.MAGIC, fmt.FORMAT_VERSION, fmt.HEADER_SIZE, fmt.RECORD_SIZE,
                                   capacity, engine_id, rank, tp_size, vocab, self.dtype_code, time.time_ns(),
                                   0, os.getpid(), fmt.STATE_OPEN, time.perf_counter_ns())
        os.replace(tmp, self.path)
        self._pack_record = fmt.RECORD.pack_into
        self._pack_row = fmt.COUNTER_ROW.pack_into
        self._pack_index = fmt.WRITE_INDEX.pack_into

    @property
    def write_index(self) -> int:
        return self._seq

    def record(self, call_index: int, mode: int, rows: int, epoch: int, nbytes: int, t_start: int,
               coll_start: int, coll_end: int, bcast_start: int, bcast_end: int,
               sample_start: int, sample_end: int, t_end: int) -> None:
        seq = self._seq + 1
        coll_ns = coll_end - coll_start
        bcast_ns = bcast_end - bcast_start
        sample_ns = sample_end - sample_start
        path_ns = t_end - t_start
        flags = 1 if bcast_start else 0
        mm = self._mm
        fields = (seq, t_start, call_index, nbytes, epoch, rows, self.vocab, self.rank, mode, self.dtype_code,
                  coll_start - t_start, coll_ns, bcast_start - t_start if flags else 0, bcast_ns,
                  sample_start - t_start, sample_ns, path_ns, flags, seq)
        offset = fmt.HEADER_SIZE + ((seq - 1) % self.capacity) * fmt.RECORD_SIZE
        try:
            self._pack_record(mm, offset, *fields)
        except struct.error:  # a duration beyond ~4.29 s or a negative offset: saturate, never raise
            self._pack_record(mm, offset, *fields[:10], *map(_u32, fields[10:17]), flags, seq)
        row = self._rows[mode]
        row[0] += 1
        coll = 1 + 2 * (fmt.OP_ALL_GATHER if mode == _ALL_GATHER else fmt.OP_GATHER)
        row[coll] += coll_ns
        row[coll + 1] += nbytes
        path_bytes = nbytes
        if flags:
            bcast_bytes = (rows + 1) * fmt.BROADCAST_BYTES_PER_ROW
            row[5] += bcast_ns  # row layout: calls, then (ns, bytes) per op in fmt.OPS order
            row[6] += bcast_bytes
            path_bytes += bcast_bytes
        row[7] += sample_ns
        row[9] += path_ns
        row[10] += path_bytes
        self._pack_row(mm, fmt.COUNTERS_OFFSET + mode * fmt.COUNTER_ROW.size, *row)
        self._pack_index(mm, fmt.WRITE_INDEX_OFFSET, seq)  # publish last: readers trust seqs <= write_index
        self._seq = seq

    def close(self, unlink: bool = False) -> None:
        """Mark the ring closed and unmap it; unlink=True also removes the file. Idempotent."""
        if self._mm is None:
            return
        fmt.STATE.pack_into(self._mm, fmt.STATE_OFFSET, fmt.STATE_CLOSED)
        self._mm.close()
        self._mm = None
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
