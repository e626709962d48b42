"""Forged bytes in a live engine's rings, and a newer look-alike engine directory without liveness locks.

With both ranks stopped (SIGSTOP), a record from the future, one with a mode no engine writes and one whose
call index lies far ahead go into rank 0's ring, and rank 1's write index jumps by 10^15: the sidecar counts
the three records as `invalid`, exports none of them, reports the engine down once its heartbeat is stale, and
counts nothing as overwritten for the jump. A copy of the engine's rings in a newer directory with no liveness
locks never displaces the live engine. After SIGCONT the engine runs on with the tokens of an untouched run.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import time

import pytest
import yaml

from gatherwise.shm_format import ring as fmt
from gatherwise.shm_format.ring import engine_dir, ring_path
from gatherwise.sidecar.ingest.ring_reader import RingReader
from tests._control_engine import BackgroundEngine, LoopSpec, reference_tokens
from tests._sidecar import total, wait_for
from tests.faults._faults import assert_sidecar_serves, sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
JUMP = 10**15
LOOKALIKE = "7fffffffffffffff"


def forge_records(path: str, records: list[dict]) -> None:
    """Append records after the newest one, then publish them with the write index, as the writer would."""
    with open(path, "r+b") as f:
        header = bytearray(f.read(fmt.HEADER_SIZE))
        capacity = fmt.HEADER_FIXED.unpack_from(header, 0)[4]
        w = fmt.WRITE_INDEX.unpack_from(header, fmt.WRITE_INDEX_OFFSET)[0]
        for seq, fields in enumerate(records, start=w + 1):
            record = bytearray(fmt.RECORD_SIZE)
            values = {"call_index": 0, "nbytes": 8, "epoch": 0, "rows": 1, "vocab": 1000, "rank": 0, "mode": 0,
                      "dtype": 0, "start_ns": time.monotonic_ns() - 10**6, **fields}
            fmt.RECORD.pack_into(record, 0, seq, values["start_ns"], values["call_index"], values["nbytes"],
                                 values["epoch"], values["rows"], values["vocab"], values["rank"], values["mode"],
                                 values["dtype"], 0, 10, 0, 0, 10, 10, 100, 0, seq)
            f.seek(fmt.slot_offset(seq, capacity))
            f.write(record)
        f.seek(fmt.WRITE_INDEX_OFFSET)
        f.write(fmt.WRITE_INDEX.pack(w + len(records)))


def jump_write_index(path: str, by: int) -> None:
    with open(path, "r+b") as f:
        f.seek(fmt.WRITE_INDEX_OFFSET)
        (w,) = struct.unpack("<Q", f.read(8))
        f.seek(fmt.WRITE_INDEX_OFFSET)
        f.write(struct.pack("<Q", w + by))


def in_flight(path: str) -> bool:
    """Whether the ring's writer has counted a call whose record it has not published yet (it counts first)."""
    with RingReader(path) as reader:
        header = reader.header()
    return sum(row.calls for row in header.counters.values()) != header.write_index


def write_index(path: str) -> int:
    with RingReader(path) as reader:
        return reader.header().write_index


def stop_between_records(pids: list[int], rings: list[str]) -> None:
    """SIGSTOP every rank outside a record(): a rank stopped inside one has counted a call it has not
    published, and that record is then truly lost to the forgery — a different case from the one tested."""
    for _ in range(200):
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(0.2)  # let the stores of a rank stopped mid-record land
        if not any(in_flight(path) for path in rings):
            return
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError("never caught both ranks between two records")


def dropped(text: str, rank: str, reason: str) -> float:
    return total(text, "gatherwise_records_dropped_total", rank=rank, reason=reason)


def test_forged_records_and_index_jump_leave_the_counts_true(tmp_path, shm_dir):
    config = tmp_path / "gatherwise.yaml"
    config.write_text(yaml.safe_dump({"engine": {"shm_dir": shm_dir}, "telemetry": {"ring_capacity": 1024},
                                      "traces": {"enabled": False}, "sidecar": {"heartbeat_stale_seconds": 1.0}}))
    engine = BackgroundEngine(LoopSpec(str(config), str(tmp_path / "stop"), pace_seconds=0.003))
    sidecar, _, api = sidecar_with_token(shm_dir, config=str(config))
    pids: list[int] = []
    try:
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached")
        engine_id = int(api.get("/v1/engine").json()["engine_id"], 16)
        rings = [ring_path(shm_dir, engine_id, r) for r in range(2)]
        for path in rings:
            with RingReader(path) as reader:
                pids.append(reader.header().writer_pid)
        stop_between_records(pids, rings)
        # every published record read first: records the sidecar had not read when the index jumps are lost to it
        # for real (and counted), a different case from the one tested
        written = sum(write_index(path) for path in rings)
        wait_for(lambda: api.get("/v1/engine").json()["records_ingested"] == written, 60, "the sidecar caught up")
        ingested = written
        calls_before = total(api.get("/metrics").text, "gatherwise_calls_total")
        forge_records(rings[0], [{"start_ns": (1 << 64) - 1000}, {"mode": 3}, {"call_index": 1 << 62}])
        jump_write_index(rings[1], JUMP)

        wait_for(lambda: dropped(api.get("/metrics").text, "0", "invalid") == 3, 60, "the forged records refused")
        wait_for(lambda: api.get("/readyz").status_code == 503, 60, "the stopped engine reported down")
        text = api.get("/metrics").text
        assert dropped(text, "1", "overwritten") == 0 and dropped(text, "1", "torn") == 0  # the jump counts nothing
        assert total(text, "gatherwise_calls_total") == calls_before  # header counters: nothing invented
        assert api.get("/v1/engine").json()["records_ingested"] == ingested
        assert_sidecar_serves(sidecar, api)

        # a newer copy of the rings without liveness locks does not displace the live engine
        lookalike = os.path.join(shm_dir, LOOKALIKE)
        os.mkdir(lookalike, 0o700)
        for rank, path in enumerate(rings):
            copy = os.path.join(lookalike, f"{fmt.RING_PREFIX}{rank}")
            shutil.copyfile(path, copy)
            with open(copy, "r+b") as f:
                f.seek(24)  # engine id, then (at 48) the creation time: tomorrow
                f.write(struct.pack("<Q", int(LOOKALIKE, 16)))
                f.seek(48)
                f.write(struct.pack("<Q", time.time_ns() + 86400 * 10**9))

        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        pids.clear()
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the engine up again")
        assert api.get("/v1/engine").json()["engine_id"] == f"{engine_id:016x}"
        more = api.get("/v1/engine").json()["records_ingested"] + 200
        wait_for(lambda: api.get("/v1/engine").json()["records_ingested"] > more, 120, "records after the faults")
        text = api.get("/metrics").text
        assert dropped(text, "0", "invalid") == 3 and dropped(text, "1", "overwritten") < 1024
        assert api.get("/v1/engine").json()["engine_id"] == f"{engine_id:016x}"  # the look-alike never won
        assert os.path.isdir(engine_dir(shm_dir, engine_id)) and os.path.isdir(lookalike)
        assert sidecar.stop() == 0, "".join(sidecar.output)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        results = engine.stop()
        if sidecar.popen.poll() is None:
            sidecar.popen.kill()
    rank0, rank1 = results
    assert rank0.modes == rank1.modes and rank0.tokens == rank1.tokens
    assert rank0.tokens == reference_tokens(engine.spec, len(rank0.tokens)), "tokens depend on the faults"
