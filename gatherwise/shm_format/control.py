"""The control block: how the sidecar asks rank 0 for a mode table, and how rank 0 answers (docs/shm-format.md).

Stdlib only (the sidecar imports it). One file per engine instance, `<shm_dir>/<engine id>/control`, created by
rank 0 (written under a temporary name, then renamed, so nobody ever maps a half-written header). All integers
little-endian u64, 8-byte aligned, so every field is one aligned store on the machines we run on. Each area sits
on its own 64-byte line and has exactly one writer:

    area       offset  writer   fields (u64 words)
    header          0  rank 0   magic(8 bytes) | version u32, block size u32 | engine id | tp size u32, pid u32
                                | created (wall ns)
    heartbeat      64  rank 0   lock | last call index | monotonic ns (time.monotonic_ns)
    command       128  sidecar  lock | seq | table word | reserved | written (monotonic ns)
    status        192  rank 0   lock | applied seq | apply call | table word | epoch | reserved | written (mono ns)

Every area but the header is seqlock-protected: the writer makes `lock` odd, writes the fields, makes it even
again; a reader copies the fields between two reads of `lock` and retries unless both reads are the same even
value. Readers never block a writer. Change FORMAT_VERSION on any layout change.

The sidecar's durable decision state (pins, policy parameters, decisions, estimates) is NOT in the block: it is
a JSON file next to it, `sidecar-state.json`, written atomically (temp file + rename) by the sidecar only.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

from gatherwise.shm_format.ring import CONTROL_NAME, WORD_BYTES, engine_dir

MAGIC = b"GWCTRL\x00\x00"
FORMAT_VERSION = 1
BLOCK_SIZE = 512
SIDECAR_STATE_NAME = "sidecar-state.json"

# The `reserved` words of the command and status areas are written 0. Earlier releases put a flag there (whether
# the sidecar's policy was auto) that nothing read; rank 0 still accepts a command whose reserved word is below
# RESERVED_LIMIT and ignores it, so such a sidecar keeps working. A larger value makes the command invalid: a
# meaning given to these bits later comes with a new FORMAT_VERSION.
RESERVED_LIMIT = 16

HEADER = struct.Struct("<8sIIQIIQ")
# Word indices into the block viewed as u64 (memoryview.cast("Q")).
HB_LOCK, HB_CALL, HB_NS = 8, 9, 10
CMD_LOCK, CMD_SEQ, CMD_TABLE, CMD_RESERVED, CMD_NS = 16, 17, 18, 19, 20
ST_LOCK, ST_SEQ, ST_CALL, ST_TABLE, ST_EPOCH, ST_RESERVED, ST_NS = 24, 25, 26, 27, 28, 29, 30
HEARTBEAT_FIELDS, COMMAND_FIELDS, STATUS_FIELDS = 2, 4, 6
U64_MASK = (1 << 64) - 1
U32_MASK = (1 << 32) - 1
SEQLOCK_TRIES = 64  # copies a reader attempts before it reports the area as inconsistent


# Command seqs are u64 serial numbers (RFC 1982): `a` is newer than `b` when a - b, modulo 2^64, is in
# [1, 2^63). So the seq wraps from 2^64 - 1 to 1 (0 means "nothing requested yet" and is skipped), and a seq
# someone wrote far ahead (2^64 - 1 into a fresh block) is not newer than what runs: it is ignored, and the next
# command follows the applied one instead of wedging control.
SEQ_HALF = 1 << 63


def seq_is_newer(seq: int, than: int) -> bool:
    return 0 < (seq - than) & U64_MASK < SEQ_HALF


def seq_after(seq: int) -> int:
    """The seq that follows `seq` (wrapping past 2^64 - 1 to 1)."""
    return ((seq + 1) & U64_MASK) or 1


def seq_reached(applied_seq: int, seq: int) -> bool:
    """Whether a status that applied `applied_seq` runs command `seq` (or a newer one)."""
    return applied_seq == seq or seq_is_newer(applied_seq, seq)


def next_command_seq(command_seq: int, applied_seq: int) -> int:
    """The seq of the next command: after the last command when that one is newer than the applied one (it may
    still be on its way to the ranks), else after the applied one."""
    return seq_after(command_seq if seq_is_newer(command_seq, applied_seq) else applied_seq)


class ControlFormatError(ValueError):
    """The file is not a control block this code understands (foreign, corrupt, other version)."""


def control_path(shm_dir: str | os.PathLike[str], engine_id: int) -> str:
    """`<shm_dir>/<engine_id as 16 hex digits>/control`."""
    return os.path.join(engine_dir(shm_dir, engine_id), CONTROL_NAME)


def sidecar_state_path(control_file: str | os.PathLike[str]) -> str:
    """Where the sidecar keeps its durable decision state for the engine that owns `control_file`."""
    return os.path.join(os.path.dirname(os.fspath(control_file)), SIDECAR_STATE_NAME)


@dataclass(frozen=True)
class ControlHeader:
    engine_id: int
    tp_size: int
    writer_pid: int
    created_ns: int


@dataclass(frozen=True)
class Heartbeat:
    call_index: int  # the call rank 0 most recently started (0 before the first call)
    monotonic_ns: int  # when it started it (0 before the first call)


@dataclass(frozen=True)
class Command:
    seq: int  # 0: nothing requested yet
    table_word: int
    reserved: int
    written_ns: int


@dataclass(frozen=True)
class Status:
    applied_seq: int  # newest command every rank runs (0: the initial table)
    apply_call: int  # call index from which every rank runs `table_word` (written when rank 0 starts that call)
    table_word: int
    epoch: int
    reserved: int
    written_ns: int


def new_block(engine_id: int, tp_size: int, table_word: int, created_ns: int, pid: int) -> bytearray:
    """The bytes of a fresh block: header, zero heartbeat and command, status = the initial table."""
    block = bytearray(BLOCK_SIZE)
    HEADER.pack_into(block, 0, MAGIC, FORMAT_VERSION, BLOCK_SIZE, engine_id & U64_MASK, tp_size, pid & U32_MASK,
                     created_ns)
    words = memoryview(block).cast("Q")
    words[ST_TABLE] = table_word
    words.release()
    return block


def parse_header(block: bytes | bytearray | memoryview | mmap.mmap, where: str = "control block") -> ControlHeader:
    """Validate magic, version and size; raise ControlFormatError naming what is wrong."""
    if len(block) < BLOCK_SIZE:
        raise ControlFormatError(f"{where}: {len(block)} bytes, a control block is {BLOCK_SIZE}")
    magic, version, size, engine_id, tp_size, pid, created = HEADER.unpack_from(block, 0)
    if magic != MAGIC:
        raise ControlFormatError(f"{where}: not a gatherwise control block (magic {bytes(magic)!r}, "
                                 f"expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise ControlFormatError(f"{where}: control block format version {version}, this code understands only "
                                 f"version {FORMAT_VERSION}; upgrade the older side")
    if size != BLOCK_SIZE:
        raise ControlFormatError(f"{where}: block size {size}, expected {BLOCK_SIZE} for version {version}")
    if tp_size < 1:
        raise ControlFormatError(f"{where}: tp size {tp_size} is not a valid tensor-parallel size")
    return ControlHeader(engine_id, tp_size, pid, created)


# -- seqlock helpers (words: the block as a memoryview cast to "Q") ---------------------------------------
def seqlock_write(words: memoryview, lock_index: int, values: tuple[int, ...]) -> None:
    """Write the fields after `lock_index`. A lock left odd by a crashed writer is simply carried on."""
    lock = words[lock_index] | 1  # odd: write in progress
    words[lock_index] = lock
    for i, value in enumerate(values, start=lock_index + 1):
        words[i] = value & U64_MASK
    words[lock_index] = (lock + 1) & U64_MASK  # even: consistent


def seqlock_read(words: memoryview, lock_index: int, count: int, tries: int = SEQLOCK_TRIES) -> tuple[int, ...] | None:
    """A consistent copy of the `count` fields after `lock_index`, or None if every try overlapped a write."""
    for _ in range(tries):
        before = words[lock_index]
        if before & 1:
            continue
        values = tuple(words[lock_index + 1: lock_index + 1 + count])
        if words[lock_index] == before:
            return values
    return None


# -- the same protocol through a file descriptor (the sidecar: pread/pwrite never fault on a shrunk file) ----
_U64 = struct.Struct("<Q")


class ControlTruncatedError(ControlFormatError):
    """The control block file became shorter than a block while it was being read or written."""


def _pread(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise ControlTruncatedError(f"control block shrank below {offset + size} bytes (truncated by another "
                                    f"process?)")
    return data


def read_block(fd: int) -> bytes:
    """The whole block, one pread (for the header; areas are read with fd_seqlock_read)."""
    return _pread(fd, BLOCK_SIZE, 0)


def fd_seqlock_read(fd: int, lock_index: int, count: int, tries: int = SEQLOCK_TRIES) -> tuple[int, ...] | None:
    """seqlock_read through `fd`: lock and fields in one pread (copied in address order), then the lock again."""
    offset = WORD_BYTES * lock_index
    for _ in range(tries):
        words = struct.unpack(f"<{count + 1}Q", _pread(fd, WORD_BYTES * (count + 1), offset))
        if words[0] & 1:
            continue
        if _U64.unpack(_pread(fd, WORD_BYTES, offset))[0] == words[0]:
            return words[1:]
    return None


def fd_read_fields(fd: int, lock_index: int, count: int) -> tuple[int, ...]:
    """The `count` fields after `lock_index` as they are, whatever the lock says (to repair an area whose only
    writer died mid-write)."""
    return struct.unpack(f"<{count}Q", _pread(fd, WORD_BYTES * count, WORD_BYTES * (lock_index + 1)))


def fd_seqlock_write(fd: int, lock_index: int, values: tuple[int, ...]) -> None:
    """seqlock_write through `fd`: lock odd, fields, lock even; each an aligned pwrite of whole u64 words.
    Refuses to write into a file that shrank (a pwrite there would grow it again)."""
    if os.fstat(fd).st_size < BLOCK_SIZE:
        raise ControlTruncatedError(f"control block is {os.fstat(fd).st_size} bytes, expected {BLOCK_SIZE}")
    offset = WORD_BYTES * lock_index
    lock = _U64.unpack(_pread(fd, WORD_BYTES, offset))[0] | 1
    os.pwrite(fd, _U64.pack(lock), offset)
    os.pwrite(fd, struct.pack(f"<{len(values)}Q", *(v & U64_MASK for v in values)), offset + WORD_BYTES)
    os.pwrite(fd, _U64.pack((lock + 1) & U64_MASK), offset)
