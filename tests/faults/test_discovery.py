"""Discovery under litter: empty and half-made engine directories, a FIFO where a ring should be, a thousand
directories of engines that died, an engine killed with SIGKILL, and a full ring of a large capacity. The sidecar
attaches to the live engine, never blocks, removes what dead engines left; a new engine start removes it too."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gatherwise.shm_format.ring import engine_dir, engine_dir_name
from tests._processes import descendants, kill_tree, vm_kib
from tests._sidecar import ROOT, wait_for
from tests.faults._faults import (
    assert_engine_progresses,
    assert_sidecar_serves,
    running_engine,
    sidecar_with_token,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def writers(*args: str, **kwargs: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.faults._writers", *args], cwd=ROOT, text=True, **kwargs)


def engine_dirs(shm: str) -> set[str]:
    return {name for name in os.listdir(shm) if len(name) == 16}


def test_sidecar_finds_the_live_engine_among_litter_and_removes_dead_dirs(shm_dir):
    engine, engine_id = running_engine(shm_dir)
    sidecar = None
    try:
        live = engine_dir_name(engine_id)
        assert writers("dead", shm_dir, "1000").wait(300) == 0
        dead = engine_dirs(shm_dir) - {live}
        assert len(dead) == 1000
        os.mkdir(os.path.join(shm_dir, "ffffffffffffffff"), 0o700)  # empty, and newer than every engine
        fifo_dir = os.path.join(shm_dir, "fffffffffffffffe")
        os.mkdir(fifo_dir, 0o700)
        os.mkfifo(os.path.join(fifo_dir, "rank-0"))  # opening it for reading would block forever
        os.mkfifo(os.path.join(engine_dir(shm_dir, engine_id), "rank-7"))  # litter inside the live engine's dir

        sidecar, _url, api = sidecar_with_token(shm_dir)
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached to the live engine")
        assert assert_sidecar_serves(sidecar, api)["engine_id"] == live
        wait_for(lambda: not (engine_dirs(shm_dir) & dead), 120, "the dead engines' directories removed")
        assert engine_dirs(shm_dir) == {live, "ffffffffffffffff", "fffffffffffffffe"}  # young or unknown: kept
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather"}).status_code == 200
        assert_engine_progresses(engine, shm_dir, engine_id)
        assert_sidecar_serves(sidecar, api)
        assert sidecar.stop() == 0, "".join(sidecar.output)
    finally:
        engine.stop()
        if sidecar is not None and sidecar.popen.poll() is None:
            sidecar.popen.kill()


def test_engine_killed_with_sigkill_is_cleaned_by_the_sidecar_and_the_next_start(shm_dir):
    sidecar, _url, api = sidecar_with_token(shm_dir)
    engines = []
    try:
        first, first_id = running_engine(shm_dir)
        engines.append(first)
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached")
        tree = [first.popen.pid, *descendants(first.popen.pid)]
        # no named POSIX semaphore (/dev/shm/sem.mp-*) anywhere in the engine: none can be left behind
        assert not [pid for pid in tree if "/sem.mp-" in Path(f"/proc/{pid}/maps").read_text()]
        kill_tree(first.popen)  # engine and ranks at once: nobody runs any cleanup
        wait_for(lambda: not os.path.exists(engine_dir(shm_dir, first_id)), 60, "the sidecar removed the dead dir")
        info = assert_sidecar_serves(sidecar, api)
        assert info["engine_id"] == engine_dir_name(first_id) and info["up"] is False  # its last numbers, marked down
        refused = api.put("/v1/mode", params={"wait": 0}, json={"mode": "gather"})
        assert refused.status_code == 409 and "not running" in refused.json()["detail"], refused.text
        assert sidecar.stop() == 0

        # without a sidecar, the next engine start removes what a killed engine left
        second, second_id = running_engine(shm_dir)
        engines.append(second)
        kill_tree(second.popen)
        assert os.path.isdir(engine_dir(shm_dir, second_id))
        third, third_id = running_engine(shm_dir)
        engines.append(third)
        assert engine_dirs(shm_dir) == {engine_dir_name(third_id)}
        assert third.stop() == 0, "".join(third.output)
        assert engine_dirs(shm_dir) == set()
    finally:
        for proc in engines:
            if proc.popen.poll() is None:
                kill_tree(proc.popen)
        if sidecar.popen.poll() is None:
            sidecar.popen.kill()


def test_full_ring_of_a_large_capacity_is_read_in_bounded_polls(shm_dir):
    capacity = 1 << 20
    writer = writers("full", shm_dir, str(capacity), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    sidecar = None
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "READY"
        cap = 4096
        sidecar, _url, api = sidecar_with_token(shm_dir, GATHERWISE_SIDECAR_MAX_RECORDS_PER_POLL=str(cap))
        info = wait_for(lambda: (i := api.get("/v1/engine").json())["records_ingested"] and i, 120, "first records")
        assert_sidecar_serves(sidecar, api)
        # a newly attached engine is read from at most `cap` records back; the rest is in the header counters
        assert info["records_ingested"] == cap, info
        assert 'gatherwise_calls_total{' in api.get("/metrics").text
        assert vm_kib(sidecar.popen.pid, "VmHWM") < 512 * 1024  # the ring file alone is 92 MiB; no copy of it
        assert sidecar.stop() == 0
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        writer.wait(60)
        if sidecar is not None and sidecar.popen.poll() is None:
            sidecar.popen.kill()


def test_ready_waits_for_the_control_block(shm_dir):
    """/readyz answers 200 only once the attached engine's control block is attached too, so a command sent then
    finds its engine. The engine is a stand-in (rings, liveness lock, control block, no torch process): its status
    area is left mid-write, as by a rank 0 stopped between two writes, which holds the attach back."""
    from gatherwise.engine_hooks.control_block import ControlBlockSource
    from gatherwise.modes import Mode, ModeTable
    from gatherwise.shm_format import control as fmt
    from tests.faults._writers import fill, make_engine

    engine_id = int.from_bytes(os.urandom(8), "little") >> 1
    lock, ring = make_engine(shm_dir, engine_id, 64)
    block = ControlBlockSource(fmt.control_path(shm_dir, engine_id), engine_id=engine_id, tp_size=1,
                               table=ModeTable.uniform(Mode.parse("all_gather")))
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(0.2):
            fill(ring, 1)

    beat = threading.Thread(target=heartbeat, daemon=True)
    fd = os.open(fmt.control_path(shm_dir, engine_id), os.O_RDWR)
    sidecar = None
    try:
        status = fmt.fd_read_fields(fd, fmt.ST_LOCK, fmt.STATUS_FIELDS)
        os.pwrite(fd, struct.pack("<Q", 1), fmt.ST_LOCK * fmt.WORD_BYTES)  # odd: a write under way
        beat.start()
        sidecar, _url, api = sidecar_with_token(shm_dir)
        wait_for(lambda: api.get("/v1/engine").json()["attached"], 60, "ingest to attach")
        ready = api.get("/readyz")
        assert ready.status_code == 503 and "control block is not attached" in ready.json()["reason"], ready.text
        assert api.get("/v1/mode").status_code == 409
        fmt.fd_seqlock_write(fd, fmt.ST_LOCK, status)  # the write completes
        wait_for(lambda: api.get("/readyz").status_code == 200, 60, "the control block to attach")
        assert set(api.get("/v1/mode").json()["active"].values()) == {"all_gather"}
    finally:
        stop.set()
        os.close(fd)
        if sidecar is not None:
            sidecar.popen.terminate()
            sidecar.popen.wait(30)
        block.close()
        ring.close()
        lock.close()
