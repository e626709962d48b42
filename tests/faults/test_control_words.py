"""Bad words in a live engine's control block, and two sidecars on one engine.

A table word that is no table (in the status or the command area), a command lock left odd by a sidecar killed
between its writes, command seqs at the end of the u64 range, and a second sidecar: the engine runs on with the
same tokens as a run without control, the sidecars answer 409 where the block cannot say what was asked (never
500), the next command repairs what a dead writer left, and exactly one sidecar writes commands.
"""

from __future__ import annotations

import os
import signal
import struct

import pytest
import yaml

from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format import control as fmt
from gatherwise.sidecar.control.block_client import ControlClient
from tests._control_engine import BackgroundEngine, LoopSpec, reference_tokens
from tests._sidecar import total, wait_for
from tests.faults._faults import assert_sidecar_serves, sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
U64_MAX = (1 << 64) - 1
NOT_A_TABLE = 0b11 | 1 << 40  # mode code 3 in bucket 1, and a bit above the table's 32


def put_word(path: str, index: int, value: int) -> None:
    """One u64 of the block, written the way another process of the engine's user could."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, struct.pack("<Q", value), index * fmt.WORD_BYTES)
    finally:
        os.close(fd)


def get_word(path: str, index: int) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return struct.unpack("<Q", os.pread(fd, fmt.WORD_BYTES, index * fmt.WORD_BYTES))[0]
    finally:
        os.close(fd)


def put_command(path: str, seq: int, table_word: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        fmt.fd_seqlock_write(fd, fmt.CMD_LOCK, (seq, table_word, 0, 1))
    finally:
        os.close(fd)


def put_command_seen(path: str, seq: int, table_word: int) -> None:
    """put_command, then wait until rank 0 has started two more calls: it looked at the command."""
    called = get_word(path, fmt.HB_CALL)
    put_command(path, seq, table_word)
    wait_for(lambda: get_word(path, fmt.HB_CALL) > called + 1, 60, "rank 0 to look at the command")


def status(path: str) -> fmt.Status:
    client = ControlClient(path)
    try:
        return client.status()
    finally:
        client.close()


def test_bad_words_odd_lock_seq_wrap_and_a_second_sidecar(tmp_path, shm_dir):
    config = tmp_path / "gatherwise.yaml"
    config.write_text(yaml.safe_dump({"engine": {"shm_dir": shm_dir}, "telemetry": {"ring_capacity": 2048},
                                      "traces": {"enabled": False}}))
    engine = BackgroundEngine(LoopSpec(str(config), str(tmp_path / "stop"), pace_seconds=0.003))
    first, _, api = sidecar_with_token(shm_dir, config=str(config))
    second = None
    try:
        wait_for(lambda: api.get("/v1/mode").status_code == 200, 120, "control attached")
        block = os.path.join(shm_dir, api.get("/v1/mode").json()["engine"], fmt.CONTROL_NAME)
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather", "buckets": [1]}).status_code == 200

        # a status table word that is no table: /metrics still answers, GET /v1/mode says why (409)
        put_word(block, fmt.ST_TABLE, NOT_A_TABLE)
        assert "gatherwise_active_mode" in api.get("/metrics").text
        refused = api.get("/v1/mode")
        assert refused.status_code == 409 and "status area" in refused.json()["detail"], refused.text
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather", "buckets": [2]}).status_code == 200
        assert api.get("/v1/mode").status_code == 200  # rank 0 wrote the status again

        # an invalid command (rank 0 ignores it): 409 naming the command area, until the next command
        put_command_seen(block, fmt.seq_after(api.get("/v1/mode").json()["requested_seq"]), NOT_A_TABLE)
        refused = api.get("/v1/mode")
        assert refused.status_code == 409 and "command area" in refused.json()["detail"], refused.text
        assert api.get("/metrics").status_code == 200
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather", "buckets": [4]}).status_code == 200

        # seqs near 2^64: one more than 2^63 ahead of what runs is ignored; two steps of less reach 2^64 - 1;
        # the sidecar's next command wraps to 1
        applied = api.get("/v1/mode").json()["applied_seq"]
        table = ModeTable.uniform(Mode.GATHER).encode()
        put_command_seen(block, U64_MAX, table)
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather", "buckets": [8]}).json()["seq"] == \
            applied + 1
        put_command(block, 1 << 63, table)
        wait_for(lambda: status(block).applied_seq == 1 << 63, 60, "seq 2^63 applied")
        put_command(block, U64_MAX, table)
        wait_for(lambda: status(block).applied_seq == U64_MAX, 60, "seq 2^64 - 1 applied")
        wrapped = api.put("/v1/mode", params={"wait": 60}, json={"mode": "all_gather", "buckets": [16]})
        assert wrapped.status_code == 200 and wrapped.json()["seq"] == 1, wrapped.text

        # a second sidecar: read-only, says so, counts nothing, writes nothing
        second, _, api2 = sidecar_with_token(shm_dir, config=str(config))
        wait_for(lambda: api2.get("/v1/mode").status_code == 200, 120, "the second sidecar attached")
        assert api2.get("/v1/mode").json()["read_only"] is True and api.get("/v1/mode").json()["read_only"] is False
        denied = api2.put("/v1/mode", params={"wait": 5}, json={"mode": "all_gather", "buckets": [1]})
        assert denied.status_code == 409 and "another sidecar" in denied.json()["detail"], denied.text
        assert api2.put("/v1/policy", json={"margin": 0.3}).status_code == 409
        assert total(api2.get("/metrics").text, "gatherwise_mode_switches_total") == 0
        assert api.get("/v1/mode").json()["pinned"]["1"] == "gather"  # the first one's pin stands

        # the owner killed between the two writes of a command (lock odd): the next owner repairs it
        put_word(block, fmt.CMD_LOCK, get_word(block, fmt.CMD_LOCK) | 1)
        first.stop(signal.SIGKILL)
        wait_for(lambda: api2.get("/v1/mode").json()["read_only"] is False, 120, "the second sidecar taking over")
        took_over = api2.put("/v1/mode", params={"wait": 60}, json={"mode": "gather", "buckets": [32]})
        assert took_over.status_code == 200, took_over.text
        state = took_over.json()["state"]
        assert state["pinned"]["1"] == "gather" and state["pinned"]["32"] == "gather"  # the first one's state kept
        assert_sidecar_serves(second, api2)
        assert second.stop() == 0, "".join(second.output)
    finally:
        results = engine.stop()
        for proc in (first, second):
            if proc is not None and proc.popen.poll() is None:
                proc.popen.kill()
    rank0, rank1 = results
    assert rank0.modes == rank1.modes and rank0.tokens == rank1.tokens
    assert rank0.control_disabled is False  # the engine kept its block through every bad word
    assert rank0.ignored_commands == 2  # the invalid table and the seq far ahead
    assert rank0.tokens == reference_tokens(engine.spec, len(rank0.tokens)), "tokens depend on the faults"
