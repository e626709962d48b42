"""Filesystems and users around shm_dir: a tmpfs another user fills, one too small from the start, a read-only
one, a symlink another user plants in a parent of shm_dir, and a root sidecar for an engine of another user.

The engine never dies for gatherwise (a rank that cannot reserve its ring runs without telemetry and says so),
refuses a path it must not use with one line, writes nothing outside its own files, and a root sidecar serves
and controls another user's engine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest
import yaml

from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.control_block import ControlBlockSource
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.engine_hooks.table_source import AppliedStatus
from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format.control import control_path
from gatherwise.shm_format.liveness import LivenessLock
from gatherwise.shm_format.private_files import ensure_private_dir
from gatherwise.shm_format.ring import engine_dir, ring_path
from tests._control_engine import BackgroundEngine, LoopSpec, reference_tokens
from tests._sidecar import wait_for
from tests.faults._faults import assert_sidecar_serves, engine_refuses, sidecar_with_token
from tests.faults._host import needs_root, other_user, run_as, tmpfs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), needs_root]


@pytest.fixture
def public_dir():
    """A fresh directory under /tmp that another user can reach (pytest's tmp_path is root's only)."""
    path = tempfile.mkdtemp(prefix="gatherwise-fault-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def loop_config(path: str, shm: str, capacity: int) -> str:
    with open(path, "w") as f:
        yaml.safe_dump({"engine": {"shm_dir": shm}, "telemetry": {"ring_capacity": capacity},
                        "traces": {"enabled": False}}, f)
    return path


def test_a_tmpfs_another_user_fills_never_ends_the_engine(tmp_path, public_dir):
    with other_user() as user, tmpfs(os.path.join(public_dir, "t"), "size=4m,mode=1777") as mnt:
        shm = os.path.join(mnt, "gw")
        config = loop_config(str(tmp_path / "gatherwise.yaml"), shm, 2048)
        engine = BackgroundEngine(LoopSpec(config, str(tmp_path / "stop"), pace_seconds=0.003))
        sidecar = None
        try:
            sidecar, _, api = sidecar_with_token(shm, config=config)
            wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached")
            fill = run_as(user, ["dd", "if=/dev/zero", f"of={mnt}/fill", "bs=64k"], timeout=120)
            assert "No space left on device" in fill.stderr, fill.stderr
            before = api.get("/v1/engine").json()["records_ingested"]
            wait_for(lambda: api.get("/v1/engine").json()["records_ingested"] > before + 200, 120,
                     "records written into the full tmpfs")
            assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather"}).status_code == 200
            info = assert_sidecar_serves(sidecar, api)
            assert info["records_dropped"] == 0
            assert sorted(os.listdir(mnt)) == ["fill", "gw"]
            assert sidecar.stop() == 0, "".join(sidecar.output)
        finally:
            results = engine.stop()
            if sidecar is not None and sidecar.popen.poll() is None:
                sidecar.popen.kill()
    rank0, rank1 = results
    assert rank0.tokens == rank1.tokens == reference_tokens(engine.spec, len(rank0.tokens))


def test_a_tmpfs_too_small_for_the_rings_runs_the_engine_without_telemetry(tmp_path, public_dir, capfd):
    with tmpfs(os.path.join(public_dir, "t"), "size=64k,mode=0700") as mnt:
        config = loop_config(str(tmp_path / "gatherwise.yaml"), os.path.join(mnt, "gw"), 2048)
        spec = LoopSpec(config, str(tmp_path / "stop"), pace_seconds=0.0, max_calls=64)
        results = BackgroundEngine(spec).stop()
        assert os.listdir(mnt) in ([], ["gw"])
    out = capfd.readouterr()
    warnings = [line for line in (out.out + out.err).splitlines() if "runs with telemetry off" in line]
    assert len(warnings) == 2 and all("No space left on device" in w for w in warnings), warnings
    rank0, rank1 = results
    assert rank0.tokens == rank1.tokens == reference_tokens(spec, 64)


def test_a_read_only_shm_dir_is_one_line_and_exit_status_2(public_dir):
    with tmpfs(os.path.join(public_dir, "ro"), "ro,mode=0700") as mnt:
        assert "is on a read-only filesystem" in engine_refuses(mnt)
        assert "Read-only file system" in engine_refuses(os.path.join(mnt, "sub"))


def test_a_symlink_another_user_plants_in_a_parent_is_never_followed(public_dir):
    victim = os.path.join(public_dir, "victim")
    os.mkdir(victim, 0o755)
    with other_user() as user:
        for name, mode in (("pub-sticky", 0o1777), ("pub-theirs", 0o755)):
            pub = os.path.join(public_dir, name)
            os.mkdir(pub)
            os.chmod(pub, mode)
            if mode == 0o755:
                os.chown(pub, user.uid, user.gid)
            assert run_as(user, ["ln", "-s", victim, os.path.join(pub, "team")]).returncode == 0
            output = engine_refuses(os.path.join(pub, "team", "engines"))
            assert f"owned by uid {user.uid}" in output, output
    assert os.listdir(victim) == []


def engine_of(uid: int, gid: int, shm: str, stop_file: str) -> int:
    """A forked single-rank engine of user uid: its directory, liveness lock, ring and control block, one call
    every few ms that polls the block and reports what it applies, as rank 0 does. A fork (no exec): the
    interpreter may live where the other user cannot read it. Returns its pid; it exits when stop_file exists."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        engine_id = 0x0123456789ABCDEF
        directory = ensure_private_dir(engine_dir(ensure_private_dir(shm), engine_id))
        lock = LivenessLock(directory, 0)
        ring = RingRecorder(ring_path(shm, engine_id, 0), engine_id=engine_id, rank=0, tp_size=1, vocab=1024,
                            dtype="float32", capacity=1024)
        table = ModeTable.uniform(Mode.ALL_GATHER)
        block = ControlBlockSource(control_path(shm, engine_id), engine_id=engine_id, tp_size=1, table=table)
        applied, call = 0, 0
        while not os.path.exists(stop_file):
            request = block.poll(call)
            if request is not None and request.seq != applied:
                applied, table = request.seq, request.table
                block.report(AppliedStatus(applied, call, table, applied))
            t = time.perf_counter_ns()
            ring.record(CallMarks(call, int(table.mode_for_rows(1)), 1, 0, 4096, t, t + 1, t + 2, 0, 0, t + 2, t + 3,
                                    t + 4))
            call += 1
            time.sleep(0.005)
        block.close()
        ring.close()
        lock.close()
        shutil.rmtree(directory)
        code = 0
    finally:
        os._exit(code)


def test_a_root_sidecar_serves_and_controls_an_engine_of_another_user(public_dir):
    with other_user() as user:
        home = os.path.join(public_dir, "home")
        os.mkdir(home, 0o700)
        os.chown(home, user.uid, user.gid)
        shm = os.path.join(home, "shm")
        stop = os.path.join(public_dir, "stop")
        pid = engine_of(user.uid, user.gid, shm, stop)
        sidecar = None
        try:
            sidecar, _, api = sidecar_with_token(shm)
            wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the root sidecar attached")
            assert os.stat(shm).st_uid == user.uid
            changed = api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather"})
            assert changed.status_code == 200 and changed.json()["state"]["active"]["1"] == "gather", changed.text
            before = api.get("/v1/engine").json()["records_ingested"]
            wait_for(lambda: api.get("/v1/engine").json()["records_ingested"] > before + 50, 60, "more records")
            assert_sidecar_serves(sidecar, api)
            assert sidecar.stop() == 0, "".join(sidecar.output)
        finally:
            with open(stop, "w"):
                pass
            _, status = os.waitpid(pid, 0)
            if sidecar is not None and sidecar.popen.poll() is None:
                sidecar.popen.kill()
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.listdir(shm) == []  # it removed its directory, the root sidecar's state file with it
