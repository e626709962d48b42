"""The sidecar's side of an engine's control block (format: gatherwise/shm_format/control.py). No torch.

The sidecar is the only writer of the command area; rank 0 the only writer of heartbeat and status. Reads are
seqlock copies that retry briefly; a block that stays inconsistent (its writer died mid-write) reads as an error,
never as made-up values. Every access is a pread/pwrite on a descriptor, not a mapping: a block someone
truncates gives a ControlFormatError here, never a SIGBUS in the sidecar.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from gatherwise.modes import ModeTable
from gatherwise.shm_format import control as fmt
from gatherwise.shm_format.control import Command, ControlFormatError, ControlHeader, Heartbeat, Status
from gatherwise.shm_format.private_files import open_regular_file

_READ_DEADLINE_S = 0.05


@dataclass(frozen=True)
class ControlSnapshot:
    header: ControlHeader
    heartbeat: Heartbeat
    command: Command
    status: Status

    @property
    def requested_table(self) -> ModeTable:
        return ModeTable.decode(self.command.table_word) if self.command.seq else self.active_table

    @property
    def active_table(self) -> ModeTable:
        return ModeTable.decode(self.status.table_word)

    def heartbeat_age_seconds(self, now_ns: int | None = None) -> float | None:
        """Seconds since rank 0 last started a call (None before its first call). Same clock on one host."""
        hb = self.heartbeat
        if hb.monotonic_ns == 0:
            return None
        return max(0.0, ((time.monotonic_ns() if now_ns is None else now_ns) - hb.monotonic_ns) * 1e-9)


class ControlClient:
    """Open the control block at `path` (must exist: rank 0 creates it). Raises ControlFormatError if foreign."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = open_regular_file(self.path, os.O_RDWR)  # no symlink, no FIFO
        try:
            size = os.fstat(self._fd).st_size
            if size != fmt.BLOCK_SIZE:
                raise ControlFormatError(f"{self.path}: {size} bytes, a control block is {fmt.BLOCK_SIZE}")
            self.header = fmt.parse_header(fmt.read_block(self._fd), self.path)
        except BaseException:
            self.close()
            raise
        self.engine_id, self.tp_size = self.header.engine_id, self.header.tp_size

    def _descriptor(self) -> int:
        if self._fd is None:
            raise ControlFormatError(f"{self.path}: control client is closed")
        return self._fd

    # -- reads ---------------------------------------------------------------------------------------------
    def _read(self, lock: int, count: int, what: str) -> tuple[int, ...]:
        deadline = time.monotonic() + _READ_DEADLINE_S
        while True:
            values = fmt.fd_seqlock_read(self._descriptor(), lock, count)
            if values is not None:
                return values
            if time.monotonic() > deadline:
                raise ControlFormatError(f"{self.path}: {what} area stays mid-write (its writer died while "
                                         f"writing?)")
            time.sleep(0.0001)

    def check_header(self) -> ControlHeader:
        """Re-validate the header (someone may have overwritten the block since it was opened)."""
        header = fmt.parse_header(fmt.read_block(self._descriptor()), self.path)
        if header.engine_id != self.engine_id:
            raise ControlFormatError(f"{self.path}: engine id changed from {self.engine_id:016x} to "
                                     f"{header.engine_id:016x}: the block was overwritten")
        return header

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(*self._read(fmt.HB_LOCK, fmt.HEARTBEAT_FIELDS, "heartbeat"))

    def command(self) -> Command:
        return Command(*self._read(fmt.CMD_LOCK, fmt.COMMAND_FIELDS, "command"))

    def status(self) -> Status:
        return Status(*self._read(fmt.ST_LOCK, fmt.STATUS_FIELDS, "status"))

    def snapshot(self) -> ControlSnapshot:
        status = self.status()  # before the heartbeat: a table reported applied at call k comes with a call >= k
        return ControlSnapshot(self.check_header(), self.heartbeat(), self.command(), status)

    # -- writes --------------------------------------------------------------------------------------------
    def next_seq(self) -> int:
        """The seq the next command gets: above both the last command and the last applied one."""
        return max(self.command().seq, self.status().applied_seq) + 1

    def write_command(self, table: ModeTable) -> int:
        """Ask rank 0 for `table`; returns the command's seq (rank 0 puts it on the wire at its next call)."""
        self.check_header()
        seq = self.next_seq()
        fmt.fd_seqlock_write(self._descriptor(), fmt.CMD_LOCK, (seq, table.encode(), 0, time.monotonic_ns()))
        return seq

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
