"""Rank 0's side of the control block (format: gatherwise/shm_format/control.py): a TableSource.

poll() runs once per logits call, so its common case is four u64 stores (the heartbeat) and one u64 load (the
command seq); the seqlock read, decode and validation run only when the seq changed. Nothing here may raise
into the engine: a block someone overwrote, corrupted or wrote in another version is ignored with one warning,
and the engine keeps the last good table (LogitsPath keeps its table while poll() returns no new request).
"""

from __future__ import annotations

import logging
import mmap
import os
import time

from gatherwise.engine_hooks.table_source import AppliedStatus, TableRequest
from gatherwise.modes import ModeTable
from gatherwise.shm_format import control as fmt
from gatherwise.shm_format.control import CMD_SEQ, HB_CALL, HB_LOCK, HB_NS
from gatherwise.shm_format.private_files import open_regular_file, write_private_file
from gatherwise.shm_format.ring import engine_dir_name

log = logging.getLogger("gatherwise.control")
_monotonic_ns = time.monotonic_ns

_READ_TRIES = 4  # the engine never spins: after a few torn reads it tries again at the next call


class ControlBlockSource:
    def __init__(self, path: str | os.PathLike[str], *, engine_id: int, tp_size: int, table: ModeTable) -> None:
        self.path = os.fspath(path)
        self.engine_id, self.tp_size = engine_id, tp_size
        block = fmt.new_block(engine_id, tp_size, table.encode(), time.time_ns(), os.getpid())
        write_private_file(self.path, bytes(block))  # complete before it becomes visible under its name
        fd = open_regular_file(self.path, os.O_RDWR)
        try:
            self._mm: mmap.mmap | None = mmap.mmap(fd, fmt.BLOCK_SIZE)
        finally:
            os.close(fd)
        self._words: memoryview | None = memoryview(self._mm).cast("Q")
        self._hb_lock = 0
        self._seen_seq = 0  # command seq last looked at (valid or not)
        self._request: TableRequest | None = None  # last good request
        self._warned: set[str] = set()
        self.ignored_commands = 0

    # -- hot path ------------------------------------------------------------------------------------------
    def poll(self, call_index: int) -> TableRequest | None:
        words = self._words
        if words is None:
            return self._request
        lock = self._hb_lock + 1
        words[HB_LOCK] = lock
        words[HB_CALL] = call_index
        words[HB_NS] = _monotonic_ns()
        words[HB_LOCK] = self._hb_lock = lock + 1
        if words[CMD_SEQ] == self._seen_seq:
            return self._request
        try:
            return self._read_command()
        except Exception as exc:
            self._disable(f"control block ignored after an unexpected error: {exc!r}")
            return self._request

    # -- slow path: a new command -------------------------------------------------------------------------
    def _read_command(self) -> TableRequest | None:
        mm, words = self._mm, self._words
        if mm is None or words is None:  # closed (both are, together): nothing to read
            return self._request
        try:
            fmt.parse_header(mm, self.path)
            header = fmt.HEADER.unpack_from(mm, 0)
            if header[3] != self.engine_id:
                raise fmt.ControlFormatError(f"{self.path}: engine id {engine_dir_name(header[3])} in the block, "
                                             f"this engine is {engine_dir_name(self.engine_id)}: the block was "
                                             "overwritten")
        except fmt.ControlFormatError as exc:
            self._disable(f"control block ignored, keeping the last good table {self._table_text()}: {exc}")
            return self._request
        values = fmt.seqlock_read(words, fmt.CMD_LOCK, fmt.COMMAND_FIELDS, tries=_READ_TRIES)
        if values is None:
            return self._request  # the sidecar is writing right now: look again at the next call
        seq, table_word, reserved, _written = values
        self._seen_seq = seq
        try:
            if not fmt.seq_is_newer(seq, self._request.seq if self._request else 0):
                raise ValueError(f"command seq {seq} is not newer than the last one applied")
            table = ModeTable.decode(table_word)
            if reserved >= fmt.RESERVED_LIMIT:
                raise ValueError(f"reserved command word is {reserved:#x}: written by a newer format")
        except ValueError as exc:
            self.ignored_commands += 1
            self._warn_once("command", f"{self.path}: invalid control command ignored, keeping the last good table "
                                       f"{self._table_text()}: {exc}")
            return self._request
        self._request = TableRequest(seq, table)
        return self._request

    def report(self, status: AppliedStatus) -> None:
        """Every rank runs request status.seq from this call on: publish it in the status area (rare, not per call)."""
        words = self._words
        if words is None:
            return
        try:
            fmt.seqlock_write(words, fmt.ST_LOCK, (status.seq, status.apply_call, status.table.encode(),
                                                   status.epoch, 0, time.monotonic_ns()))
        except Exception as exc:  # never raise into the engine
            self._disable(f"control block status could not be written: {exc}")

    # -- lifecycle ----------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._words is not None:
            self._words.release()
            self._words = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    @property
    def disabled(self) -> bool:
        return self._words is None

    def _disable(self, message: str) -> None:
        self._warn_once("disabled", message)
        self.close()  # stop touching a block that is not ours any more; keep the last good request

    def _warn_once(self, kind: str, message: str) -> None:
        if kind in self._warned:
            log.debug(message)
            return
        self._warned.add(kind)
        log.warning(message)

    def _table_text(self) -> str:
        return f"({self._request.table})" if self._request is not None else "(the initial table)"
