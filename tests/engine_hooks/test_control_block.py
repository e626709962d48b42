"""Control block: layout, seqlock, rank 0's poll/report and the sidecar client, in one process (no torch)."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from gatherwise.engine_hooks.control_block import ControlBlockSource
from gatherwise.engine_hooks.table_source import AppliedStatus
from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format import control as fmt
from gatherwise.sidecar.control.block_client import ControlClient, ControlFormatError

GATHER = ModeTable.uniform(Mode.GATHER)
ALL_GATHER = ModeTable.uniform(Mode.ALL_GATHER)
ENGINE = 0x1234_5678_9ABC_DEF0


@pytest.fixture
def block(shm_dir):
    path = fmt.control_path(shm_dir, ENGINE)
    os.makedirs(os.path.dirname(path))
    source = ControlBlockSource(path, engine_id=ENGINE, tp_size=2, table=ALL_GATHER)
    client = ControlClient(path)
    yield path, source, client
    client.close()
    source.close()


def test_control_path_layout(shm_dir):
    assert fmt.control_path(shm_dir, 0xAB) == os.path.join(shm_dir, "00000000000000ab", "control")
    assert fmt.sidecar_state_path(fmt.control_path(shm_dir, 0xAB)).endswith("00000000000000ab/sidecar-state.json")


def test_fresh_block_has_header_initial_status_and_no_command(block):
    _, _, client = block
    snap = client.snapshot()
    assert (snap.header.engine_id, snap.header.tp_size, snap.header.writer_pid) == (ENGINE, 2, os.getpid())
    assert snap.command.seq == 0 and snap.status.applied_seq == 0
    assert snap.active_table == ALL_GATHER == snap.requested_table
    assert snap.rank0_heartbeat_age_seconds() is None


def test_command_round_trip_and_status(block):
    _, source, client = block
    assert source.poll(0) is None
    seq = client.write_command(GATHER.with_buckets(Mode.ALL_GATHER, [0]))
    request = source.poll(1)
    assert request.seq == seq
    assert request.table == GATHER.with_buckets(Mode.ALL_GATHER, [0])
    assert source.poll(2) is request  # unchanged seq: the cached request, no re-read
    source.report(AppliedStatus(seq, 3, request.table, 1))
    snap = client.snapshot()
    assert (snap.status.applied_seq, snap.status.apply_call, snap.status.epoch, snap.status.reserved) == (seq, 3, 1, 0)
    assert snap.command.reserved == 0
    assert snap.active_table == request.table
    assert snap.heartbeat.call_index == 2 and snap.rank0_heartbeat_age_seconds() >= 0
    assert client.next_seq() == seq + 1


def test_invalid_command_is_ignored_with_one_warning(block, caplog):
    _path, source, client = block
    good = client.write_command(GATHER)
    assert source.poll(0).seq == good
    with caplog.at_level(logging.WARNING, "gatherwise.control"):
        for i in range(3):  # mode code 3 (not a mode) in bucket 0, three times: one warning
            fmt.fd_seqlock_write(client._fd, fmt.CMD_LOCK, (good + 1 + i, 3, 0, 0))
            assert source.poll(1 + i).table == GATHER
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert "invalid control command" in caplog.text and source.ignored_commands == 3
    assert client.write_command(ALL_GATHER) and source.poll(9).table == ALL_GATHER  # later good commands apply


@pytest.mark.parametrize("damage", ["zeros", "magic", "version", "engine_id"])
def test_overwritten_block_is_ignored_and_engine_keeps_table(block, caplog, damage):
    path, source, client = block
    client.write_command(GATHER)
    assert source.poll(0).table == GATHER
    with open(path, "r+b") as f:
        if damage == "zeros":
            f.write(bytes(fmt.BLOCK_SIZE))
        elif damage == "magic":
            f.write(b"NOTOURS!")
        elif damage == "version":
            f.seek(8), f.write((99).to_bytes(4, "little"))
        else:
            f.seek(16), f.write((42).to_bytes(8, "little"))
        f.seek(fmt.CMD_SEQ * 8), f.write((77).to_bytes(8, "little"))  # a "new command" makes poll look
    with caplog.at_level(logging.WARNING, "gatherwise.control"):
        for call in range(1, 5):
            assert source.poll(call).table == GATHER
    assert source.disabled
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "control block ignored" in warnings[0].getMessage()
    source.report(AppliedStatus(5, 6, ALL_GATHER, 2))  # no-op, no raise


def test_client_rejects_foreign_files(shm_dir):
    path = os.path.join(shm_dir, "control")
    with open(path, "wb") as f:
        f.write(b"x" * fmt.BLOCK_SIZE)
    with pytest.raises(ControlFormatError, match="not a gatherwise control block"):
        ControlClient(path)
    with open(path, "wb") as f:
        f.write(b"short")
    with pytest.raises(ControlFormatError, match="5 bytes"):
        ControlClient(path)


def test_seqlock_reader_never_sees_a_torn_write():
    words = memoryview(bytearray(64)).cast("Q")
    stop = threading.Event()
    torn = []

    def reader():
        while not stop.is_set():
            values = fmt.seqlock_read(words, 0, 3)
            if values is not None and len(set(values)) != 1:
                torn.append(values)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(20000):
        fmt.seqlock_write(words, 0, (i, i, i))
    stop.set()
    thread.join()
    assert not torn
    assert words[0] % 2 == 0


def test_seqlock_odd_lock_reads_none_and_next_write_repairs_it():
    words = memoryview(bytearray(64)).cast("Q")
    words[0] = 7  # a writer died mid-write
    assert fmt.seqlock_read(words, 0, 2, tries=3) is None
    fmt.seqlock_write(words, 0, (5, 6))
    assert words[0] % 2 == 0 and fmt.seqlock_read(words, 0, 2) == (5, 6)


def test_reserved_command_word_below_the_limit_is_ignored_above_it_invalid(block):
    """An earlier sidecar wrote 1 there (its unread 'auto' flag): still applied. A larger value is from a newer
    format: the command is ignored and the engine keeps its table."""
    _, source, client = block
    fmt.fd_seqlock_write(client._fd, fmt.CMD_LOCK, (1, GATHER.encode(), 1, 0))
    assert source.poll(0).table == GATHER
    fmt.fd_seqlock_write(client._fd, fmt.CMD_LOCK, (2, ALL_GATHER.encode(), fmt.RESERVED_LIMIT, 0))
    assert source.poll(1).table == GATHER and source.ignored_commands == 1
