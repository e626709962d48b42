"""The sidecar's side of an engine's control block (format: gatherwise/shm_format/control.py). No torch.

The sidecar is the only writer of the command area; rank 0 the only writer of heartbeat and status. Reads are
seqlock copies that retry briefly; a block that stays inconsistent (its writer died mid-write) reads as an error,
never as made-up values. Every access is a pread/pwrite on a descriptor, not a mapping: a block someone
truncates gives a ControlFormatError here, never a SIGBUS in the sidecar.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from dataclasses import dataclass

from gatherwise.modes import ModeTable
from gatherwise.shm_format import control as fmt
from gatherwise.shm_format.control import Command, ControlFormatError, ControlHeader, Heartbeat, Status
from gatherwise.shm_format.private_files import open_regular_file

log = logging.getLogger("gatherwise.sidecar.control")
_READ_DEADLINE_S = 0.05


class AreaMidWriteError(ControlFormatError):
    """An area's lock stayed odd for the whole read deadline: its writer died between its writes (or is
    stopped). The block itself is still this engine's."""


class InvalidTableWordError(ValueError):
    """An area of the block holds a table word that is no mode table (a forged or corrupt word, or a command no
    engine applies): the API answers 409 with this message, the block stays in use."""


def _table(word: int, area: str) -> ModeTable:
    try:
        return ModeTable.decode(word)
    except ValueError as exc:
        raise InvalidTableWordError(f"the control block's {area} area holds table word {word:#x}, which is not a "
                                    f"mode table ({exc})") from None


@dataclass(frozen=True)
class ControlSnapshot:
    header: ControlHeader
    heartbeat: Heartbeat
    command: Command
    status: Status

    @property
    def requested_table(self) -> ModeTable:
        """The table last asked for; InvalidTableWordError for a word rank 0 ignores (it keeps its table)."""
        return _table(self.command.table_word, "command") if self.command.seq else self.active_table

    @property
    def active_table(self) -> ModeTable:
        """The table every rank runs; InvalidTableWordError while the status area holds a forged word."""
        return _table(self.status.table_word, "status")

    @property
    def pending(self) -> bool:
        """A command that every rank does not run yet."""
        return fmt.seq_is_newer(self.command.seq, self.status.applied_seq)

    def rank0_heartbeat_age_seconds(self, now_ns: int | None = None) -> float | None:
        """Seconds since rank 0 last started a call (None before its first call): GET /v1/mode's
        call_started_age_seconds. Same clock on one host. (/readyz's is Ingest.newest_record_age_seconds.)"""
        hb = self.heartbeat
        if hb.monotonic_ns == 0:
            return None
        return max(0.0, ((time.monotonic_ns() if now_ns is None else now_ns) - hb.monotonic_ns) * 1e-9)


class ControlClient:
    """Open the control block at `path` (must exist: rank 0 creates it). Raises ControlFormatError if foreign."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = open_regular_file(self.path, os.O_RDWR, owner_of_dir=True)  # no link, FIFO
        try:
            size = os.fstat(self._fd).st_size
            if size != fmt.BLOCK_SIZE:
                raise ControlFormatError(f"{self.path}: {size} bytes, a control block is {fmt.BLOCK_SIZE}")
            self.header = fmt.parse_header(fmt.read_block(self._fd), self.path)
        except BaseException:
            self.close()
            raise
        self.engine_id, self.tp_size = self.header.engine_id, self.header.tp_size
        self.owned = False  # whether this client holds the engine's control lock (try_own)

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
                raise AreaMidWriteError(f"{self.path}: {what} area stays mid-write (its writer died while "
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
        """The command area. Its only writer is the owner of the control lock, so for the owner a lock that
        stays odd was left by an earlier owner that died between its writes: the owner rewrites the fields as
        they are, which makes the lock even again (the seq in them is either the old or the new one, and the
        next command follows both)."""
        try:
            return Command(*self._read(fmt.CMD_LOCK, fmt.COMMAND_FIELDS, "command"))
        except AreaMidWriteError:
            if not self.owned:
                raise
        fields = fmt.fd_read_fields(self._descriptor(), fmt.CMD_LOCK, fmt.COMMAND_FIELDS)
        fmt.fd_seqlock_write(self._descriptor(), fmt.CMD_LOCK, fields)
        log.warning("%s: command area was left mid-write by a sidecar that died; repaired", self.path)
        return Command(*fields)

    def status(self) -> Status:
        return Status(*self._read(fmt.ST_LOCK, fmt.STATUS_FIELDS, "status"))

    def snapshot(self) -> ControlSnapshot:
        status = self.status()  # before the heartbeat: a table reported applied at call k comes with a call >= k
        return ControlSnapshot(self.check_header(), self.heartbeat(), self.command(), status)

    # -- control ownership -----------------------------------------------------------------------------------
    def try_own(self) -> bool:
        """Take this engine's control lock (an exclusive flock on the block, held until close() or the end of
        the process, however it ends): one sidecar writes commands, any other serves read-only."""
        try:
            fcntl.flock(self._descriptor(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.owned = True
        return True

    # -- writes --------------------------------------------------------------------------------------------
    def next_seq(self) -> int:
        """The seq the next command gets: after the last command and the last applied one (control.py)."""
        return fmt.next_command_seq(self.command().seq, self.status().applied_seq)

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
