"""File modes, ownership and symlinks: what the engine and the sidecar create is private to their user at any
umask, a shm_dir someone else owns or can write is refused with a clear error, and no planted symlink makes
either side read or write a file outside gatherwise's own."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gatherwise.shm_format.control import SIDECAR_STATE_NAME
from gatherwise.shm_format.private_files import UnsafePathError, ensure_private_dir, write_private_file
from gatherwise.shm_format.ring import engine_dir, engine_dir_name
from tests._sidecar import wait_for
from tests.faults._faults import (
    NOBODY,
    assert_sidecar_serves,
    engine_refuses,
    running_engine,
    sidecar_with_token,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_everything_is_private_at_umask_000(tmp_path):
    shm = str(tmp_path / "shm")  # does not exist: the engine creates it
    old = os.umask(0)
    try:
        engine, engine_id = running_engine(shm)
        sidecar, _url, api = sidecar_with_token(shm)
    finally:
        os.umask(old)
    try:
        directory = engine_dir(shm, engine_id)
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached")
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather"}).status_code == 200
        wait_for(lambda: os.path.exists(os.path.join(directory, SIDECAR_STATE_NAME)), 30, "the sidecar's state")
        assert mode(shm) == 0o700 and mode(directory) == 0o700
        names = sorted(os.listdir(directory))
        assert {"rank-0", "rank-1", "control", "alive-0", "alive-1", SIDECAR_STATE_NAME} <= set(names), names
        assert {name: mode(os.path.join(directory, name)) for name in names} == dict.fromkeys(names, 0o600)
        assert sidecar.stop() == 0
    finally:
        engine.stop()
        if sidecar.popen.poll() is None:
            sidecar.popen.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a directory another user owns")
def test_shm_dir_of_another_user_is_refused(tmp_path):
    shm = tmp_path / "taken"
    shm.mkdir(mode=0o755)
    os.chown(shm, NOBODY, NOBODY)  # another user created it first
    output = engine_refuses(str(shm))
    assert f"{shm}: owned by uid {NOBODY}, not by this user" in output, output
    assert os.listdir(shm) == []  # nothing written into it


def test_shm_dir_writable_by_others_or_a_symlink_is_refused(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    output = engine_refuses(str(open_dir))
    assert "lets other users write into it" in output and "chmod go-w" in output, output
    assert os.listdir(open_dir) == []
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    output = engine_refuses(str(link))
    assert "is a symlink" in output, output
    assert os.listdir(target) == []


def test_engine_directory_that_is_a_symlink_is_refused(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (shm / "0123456789abcdef").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="is a symlink"):
        ensure_private_dir(shm / "0123456789abcdef")


def test_planted_symlinks_never_redirect_a_write(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    directory = tmp_path / "engine"
    directory.mkdir(mode=0o700)
    state = directory / SIDECAR_STATE_NAME
    for pid in range(os.getpid() - 5, os.getpid() + 5):  # the old fixed temporary name, for nearby pids
        (directory / f"{SIDECAR_STATE_NAME}.tmp-{pid}").symlink_to(victim)
    state.symlink_to(victim)  # and the final name itself
    write_private_file(state, b"{}")
    assert victim.read_text() == "precious"
    assert not state.is_symlink() and state.read_bytes() == b"{}" and mode(state) == 0o600


def test_sidecar_ignores_symlinked_engine_dirs_and_state(shm_dir, tmp_path):
    engine, engine_id = running_engine(shm_dir)
    sidecar = None
    try:
        # a newer "engine" that is a link to a copy of the real one outside shm_dir, and a symlinked state file
        outside = tmp_path / "outside"
        outside.mkdir(mode=0o700)
        real = Path(engine_dir(shm_dir, engine_id))
        for name in ("rank-0", "rank-1", "control"):
            (outside / name).write_bytes((real / name).read_bytes())
        (Path(shm_dir) / "7fffffffffffffff").symlink_to(outside)
        victim = tmp_path / "victim.json"
        victim.write_text("precious")
        (real / SIDECAR_STATE_NAME).symlink_to(victim)
        sidecar, _url, api = sidecar_with_token(shm_dir)
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached")
        info = assert_sidecar_serves(sidecar, api)
        assert info["engine_id"] == engine_dir_name(engine_id)
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather"}).status_code == 200
        wait_for(lambda: not (real / SIDECAR_STATE_NAME).is_symlink(), 30, "the state saved over the link")
        assert victim.read_text() == "precious"
        assert sorted(p.name for p in outside.iterdir()) == ["control", "rank-0", "rank-1"]
        assert sidecar.stop() == 0
    finally:
        engine.stop()
        if sidecar is not None and sidecar.popen.poll() is None:
            sidecar.popen.kill()
