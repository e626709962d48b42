"""`truncate -s 0` of a ring or of the control block under a running engine and sidecar.

The sidecar reads with pread() and never maps these files, so it cannot fault: it keeps serving, says which ring
stopped being readable, and refuses commands to the block with a clear 409. The engine's own mappings are
protected by the file modes (0600 in a 0700 directory): another user cannot truncate or even open them. A process
running as the engine's own user can (it could as well kill or ptrace the engine); docs/deployment.md says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from gatherwise.shm_format.control import control_path
from gatherwise.shm_format.ring import engine_dir, engine_dir_name, ring_path
from tests._processes import kill_tree
from tests._sidecar import wait_for
from tests.faults._faults import (
    NOBODY,
    assert_engine_progresses,
    assert_sidecar_serves,
    running_engine,
    sidecar_with_token,
)
from tests.faults._host import as_user

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


# Callable[..., object], not [[], object]: mypy cannot infer the callers' lambdas with a default (`p=path`) for the
# latter; `action` is called with no arguments.
def as_other_user(action: Callable[..., object]) -> int:
    """Run `action` in a child process with uid/gid NOBODY; returns the errno it raised (0 if none)."""
    return as_user(NOBODY, NOBODY, action)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_can_neither_truncate_nor_open_nor_plant(shm_dir):
    engine, engine_id = running_engine(shm_dir)
    try:
        ring, block = ring_path(shm_dir, engine_id, 1), control_path(shm_dir, engine_id)
        for path in (ring, block):
            assert as_other_user(lambda p=path: os.truncate(p, 0)) == 13  # EACCES
            assert as_other_user(lambda p=path: os.open(p, os.O_RDONLY)) == 13
        assert as_other_user(lambda: os.mkdir(os.path.join(shm_dir, "ffffffffffffffff"))) == 13
        assert as_other_user(lambda: os.listdir(engine_dir(shm_dir, engine_id))) == 13
        assert os.path.getsize(ring) > 0 and os.path.getsize(block) == 512
        assert_engine_progresses(engine, shm_dir, engine_id)
    finally:
        engine.stop()


def test_truncated_ring_and_block_leave_the_sidecar_serving(shm_dir):
    engine, engine_id = running_engine(shm_dir)
    sidecar, _url, api = sidecar_with_token(shm_dir)
    try:
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached")
        assert api.put("/v1/mode", params={"wait": 0}, json={"mode": "gather"}).status_code in (200, 202)
        os.truncate(ring_path(shm_dir, engine_id, 1), 0)
        os.truncate(control_path(shm_dir, engine_id), 0)
        # the same-user truncation ends the engine (documented); end it for good so its ranks do not wait on
        # each other until the collective timeout
        kill_tree(engine.popen)
        wait_for(lambda: "no longer readable" in "".join(sidecar.output) or None, 30, "the sidecar's warning")
        info = assert_sidecar_serves(sidecar, api)
        assert info["engine_id"] == engine_dir_name(engine_id)
        refused = api.put("/v1/mode", params={"wait": 0}, json={"mode": "all_gather"})
        assert refused.status_code == 409, refused.text
        assert "control block" in refused.json()["detail"] or "not running" in refused.json()["detail"]
        assert api.get("/v1/stats").status_code == 200
        assert "Traceback" not in "".join(sidecar.output)
        assert sidecar.stop() == 0, "".join(sidecar.output)
    finally:
        if engine.popen.poll() is None:
            kill_tree(engine.popen)
        if sidecar.popen.poll() is None:
            sidecar.popen.kill()
