"""An engine directory left empty (an engine killed while it made it) and older than a minute is removed by the
sidecar, as the docs say; a fresh empty one (an engine making it now) is left alone."""

from __future__ import annotations

import os
import time

import pytest

from gatherwise.shm_format.liveness import EMPTY_DIR_GRACE_S
from gatherwise.shm_format.private_files import ensure_private_dir
from gatherwise.shm_format.ring import engine_dir
from tests.faults._faults import assert_sidecar_serves, sidecar_with_token, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_an_empty_engine_directory_older_than_the_grace_is_removed(shm_dir):
    old = ensure_private_dir(engine_dir(shm_dir, 0x1234))
    fresh = ensure_private_dir(engine_dir(shm_dir, 0x5678))
    then = time.time() - 2 * EMPTY_DIR_GRACE_S
    os.utime(old, (then, then))
    proc, _url, api = sidecar_with_token(shm_dir)
    try:
        wait_gone(str(old))
        assert os.path.isdir(fresh)  # the same pass saw it: too young to be anyone's leftover
        assert_sidecar_serves(proc, api)
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
