"""The per-rank telemetry ring: header, cumulative counters and fixed-size call records (docs/shm-format.md).

Stdlib only (the sidecar imports it). One writer (gatherwise.engine_hooks.recorder.RingRecorder), any number of
readers (gatherwise.sidecar.ingest.ring_reader.RingReader). All integers little-endian. Change FORMAT_VERSION on any
layout change: readers refuse every version they were not written for.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

# The header's dtype field holds a logits dtype code (gatherwise.logits_dtypes); named here for ring readers.
from gatherwise.logits_dtypes import DTYPE_NAMES as DTYPE_NAMES
from gatherwise.logits_dtypes import dtype_name as dtype_name
from gatherwise.modes import Mode

MAGIC = b"GWRING\x00\x00"
FORMAT_VERSION = 2
HEADER_SIZE = 512  # records start here
WORD_BYTES = 8  # counters, indices and control fields are little-endian u64 words

# -- directory layout: <shm_dir>/<engine_id as 16 hex digits>/rank-<r> and .../control -------------------
RING_PREFIX = "rank-"
CONTROL_NAME = "control"


ENGINE_ID_HEX_DIGITS = 16  # a 64-bit engine id, zero-padded lowercase hex: the directory's name


def engine_dir_name(engine_id: int) -> str:
    return f"{engine_id:0{ENGINE_ID_HEX_DIGITS}x}"


def engine_dir(shm_dir: str | os.PathLike[str], engine_id: int) -> str:
    return os.path.join(os.fspath(shm_dir), engine_dir_name(engine_id))


def ring_path(shm_dir: str | os.PathLike[str], engine_id: int, rank: int) -> str:
    return os.path.join(engine_dir(shm_dir, engine_id), f"{RING_PREFIX}{rank}")


# -- header ------------------------------------------------------------------------------------------------
# created_ns is the wall clock, created_mono_ns perf_counter_ns at the same instant (named here, in order, for
# docs/shm-format.md's table, which a test checks against these names and the struct's offsets)
HEADER_FIXED_FIELDS = ("magic", "version", "header_size", "record_size", "capacity", "engine_id", "rank", "tp_size",
                       "vocab", "dtype", "created_ns", "write_index", "writer_pid", "state", "created_mono_ns")
HEADER_FIXED = struct.Struct("<8sIIIIQIIIIQQIIQ")
assert len(HEADER_FIXED_FIELDS) == len(HEADER_FIXED.unpack(bytes(HEADER_FIXED.size)))
WRITE_INDEX_OFFSET = 56
WRITE_INDEX = struct.Struct("<Q")
STATE_OFFSET = 68
STATE = struct.Struct("<I")
STATE_OPEN, STATE_CLOSED = 1, 2

# Cumulative counters: one row per mode code (0..NUM_MODE_ROWS-1), each row = calls, then (ns, bytes) per op.
OPS = ("all_gather", "gather", "broadcast", "sample", "path", "shard_exchange", "shard_resolve")
OP_ALL_GATHER, OP_GATHER, OP_BROADCAST, OP_SAMPLE, OP_PATH, OP_SHARD_EXCHANGE, OP_SHARD_RESOLVE = range(len(OPS))
# One row per mode (code 3 of the 2-bit mode code is not a mode): a new mode changes the layout (FORMAT_VERSION).
NUM_MODE_ROWS = len(Mode)
COUNTERS_OFFSET = 128
COUNTER_ROW = struct.Struct(f"<{1 + 2 * len(OPS)}Q")
COUNTERS = struct.Struct(f"<{NUM_MODE_ROWS * (1 + 2 * len(OPS))}Q")
# Top-p rows sampled in sharded mode, and how many of them took the full-row fallback (cumulative u64 each),
# in the bytes after the fixed header fields.
TOPP_ROWS_OFFSET = 80
TOPP_FALLBACK_ROWS_OFFSET = 88
TOPP_COUNTERS = struct.Struct("<QQ")
assert HEADER_FIXED.size <= TOPP_ROWS_OFFSET
assert TOPP_ROWS_OFFSET + TOPP_COUNTERS.size <= COUNTERS_OFFSET
assert COUNTERS_OFFSET + COUNTERS.size <= HEADER_SIZE

# Calls whose timings never reached a record, per reason (their calls and bytes are counted all the same):
#   timing_backlog  the CUDA event resolver gave up on them: the device was too many calls behind the host
#   timing_at_close their events had not completed when the recorder closed
# Rings of writers that predate these counters hold zeros here (the area was reserved and zero).
DROP_REASONS = ("timing_backlog", "timing_at_close")
DROP_TIMING_BACKLOG, DROP_TIMING_AT_CLOSE = range(len(DROP_REASONS))
DROPS_OFFSET = COUNTERS_OFFSET + COUNTERS.size  # 488
DROPS = struct.Struct(f"<{len(DROP_REASONS)}Q")
assert DROPS_OFFSET + DROPS.size <= HEADER_SIZE

# The operations a call runs, by mode: (its first collective, its second operation or None). In a record the
# first is timed by the collective fields, the second by the second-operation fields (flag FLAG_BROADCAST or
# FLAG_RESOLVE says which second operation ran). Keyed by Mode, which is an int: a mode code finds its entry.
MODE_OPS: dict[int, tuple[str, str | None]] = {
    Mode.ALL_GATHER: ("all_gather", None),
    Mode.GATHER: ("gather", "broadcast"),
    Mode.SHARDED: ("shard_exchange", "shard_resolve"),
}
assert tuple(MODE_OPS) == tuple(Mode)  # every mode, in code order

# -- record ------------------------------------------------------------------------------------------------
# Offsets are from start_ns; all u32 fields are ns and saturate at U32_MAX (~4.29 s); seq_end repeats seq.
RECORD_FIELD_NAMES = ("seq", "start_ns", "call_index", "nbytes", "epoch", "rows", "vocab", "rank", "mode", "dtype",
                      "collective_offset", "collective_ns", "second_offset", "second_ns", "sample_offset",
                      "sample_ns", "path_ns", "flags", "seq_end")
RECORD = struct.Struct("<QQQQIIIHBBIIIIIIIIQ")
RECORD_SIZE = RECORD.size  # 88
RECORD_FIELDS = len(RECORD_FIELD_NAMES)
assert len(RECORD.unpack(bytes(RECORD.size))) == RECORD_FIELDS
U32_MAX = 0xFFFFFFFF
FLAG_BROADCAST = 1  # the call broadcast tokens (gather mode); the second-operation fields time it
FLAG_RESOLVE = 2  # sharded mode: the call ran its second collective (shard_resolve), which those fields time
# flags bits 2..7: the call's tag (gatherwise.call_kind.call_tag): bits 2..5 what it sampled (0: the writer does
# not say), bits 6..7 the mode its table named, which differs from `mode` where the call stepped aside.
TAG_SHIFT = 2
TAG_MASK = 0x3F
FALLBACK_SHIFT = 8  # flags bits 8..31: top-p rows of this call that took the full-row fallback (sharded mode)
FALLBACK_MAX = (1 << (32 - FALLBACK_SHIFT)) - 1  # what the rest of the u32 flags field holds
BROADCAST_BYTES_PER_ROW = 8  # int64 token ids; plus one 8-byte control word per call


def broadcast_bytes(rows: int) -> int:
    """Bytes of the token broadcast of a gather-mode call: rows int64 tokens + the 64-bit control word."""
    return (rows + 1) * BROADCAST_BYTES_PER_ROW


def second_op_flag(mode: int) -> int:
    """The flag a record of a `mode` call carries when it ran a second operation: FLAG_RESOLVE where that is
    shard_resolve, else FLAG_BROADCAST (also for a mode without one, the flag such a record has always had)."""
    return FLAG_RESOLVE if MODE_OPS[mode][1] == "shard_resolve" else FLAG_BROADCAST


def ring_file_size(capacity: int) -> int:
    return HEADER_SIZE + capacity * RECORD_SIZE


def slot_of(seq: int, capacity: int) -> int:
    """Slot index of the record with sequence number seq (seqs start at 1)."""
    return (seq - 1) % capacity


def slot_offset(seq: int, capacity: int) -> int:
    """Byte offset of the record with sequence number seq (seqs start at 1)."""
    return HEADER_SIZE + slot_of(seq, capacity) * RECORD_SIZE


@dataclass(frozen=True)
class OpCounters:
    ns: int
    bytes: int


@dataclass(frozen=True)
class ModeCounters:
    calls: int
    ops: dict[str, OpCounters]  # op name -> cumulative ns and bytes


@dataclass(frozen=True)
class RingHeader:
    version: int
    engine_id: int
    rank: int
    tp_size: int
    vocab: int
    dtype: str
    record_size: int
    capacity: int
    created_ns: int
    created_mono_ns: int
    write_index: int  # records ever written; the newest record has seq == write_index
    writer_pid: int
    closed: bool
    counters: dict[int, ModeCounters]  # mode code -> counters (every row, including unused modes)
    drops: dict[str, int] = field(default_factory=dict)  # DROP_REASONS -> calls recorded without timings
    topp_rows: int = 0  # top-p rows sampled in sharded mode, cumulative
    topp_fallback_rows: int = 0  # of those, rows that took the full-row fallback

    def mono_to_wall_ns(self, mono_ns: int) -> int:
        """Wall-clock ns (time.time_ns scale) of a monotonic timestamp from this ring."""
        return self.created_ns + (mono_ns - self.created_mono_ns)


def second_op_of(flags: int) -> str | None:
    """Which second operation a record's second-operation fields time, from its flags."""
    if flags & FLAG_RESOLVE:
        return "shard_resolve"
    return "broadcast" if flags & FLAG_BROADCAST else None


def tag_of(flags: int) -> int:
    """The call tag a record's flags carry (gatherwise.call_kind.call_tag)."""
    return (flags >> TAG_SHIFT) & TAG_MASK


def counters_from_values(values: tuple[int, ...]) -> dict[int, ModeCounters]:
    width = 1 + 2 * len(OPS)
    out = {}
    for mode in range(NUM_MODE_ROWS):
        row = values[mode * width:(mode + 1) * width]
        ops = {name: OpCounters(row[1 + 2 * i], row[2 + 2 * i]) for i, name in enumerate(OPS)}
        out[mode] = ModeCounters(row[0], ops)
    return out


@dataclass(slots=True)
class CallRecord:
    """One logits call on one rank. Times are monotonic ns (time.perf_counter_ns); absent ops are 0."""

    seq: int
    call_index: int
    mode: int  # gatherwise.modes.Mode value
    rows: int
    vocab: int
    dtype: str
    rank: int
    epoch: int
    nbytes: int
    start_ns: int
    collective_start_ns: int
    collective_ns: int
    second_start_ns: int  # the second operation (second_op) and its duration
    second_ns: int
    sample_start_ns: int
    sample_ns: int
    end_ns: int
    second_op: str | None = None  # "broadcast" (gather mode), "shard_resolve" (sharded mode) or None
    fallback_rows: int = 0  # top-p rows of this call that took the full-row fallback (sharded mode)
    tag: int = 0  # what the call sampled and the mode its table named (gatherwise.call_kind.call_tag)

    @property
    def path_ns(self) -> int:
        return self.end_ns - self.start_ns
