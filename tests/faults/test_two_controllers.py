"""A file named `control` planted in an observer's engine directory (node 1 of a TP group across two nodes, which
holds rank 1 only): a symlink to a control block, or a regular copy of node 0's block. The observer stays an
observer (Prometheus sees one controller per group), refuses mutations with 409, and never answers a PUT 202 for
a block rank 0 does not read."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format.control import CONTROL_NAME, new_block
from gatherwise.shm_format.private_files import write_private_file
from gatherwise.shm_format.ring import engine_dir
from tests._sidecar import ROOT, scrape, total, wait_for
from tests.faults._faults import sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def observer_role(url: str) -> bool:
    text = scrape(url)
    return total(text, "gatherwise_sidecar_role", role="observer") == 1 and \
        total(text, "gatherwise_sidecar_role", role="controller") == 0


@pytest.mark.parametrize("plant", ["symlink", "copy"])
def test_a_planted_control_file_never_makes_a_second_controller(shm_dir, plant):
    engine_id = int.from_bytes(os.urandom(8), "little") >> 1
    node1 = subprocess.Popen([sys.executable, "-m", "tests.faults._writers", "node1", shm_dir, str(engine_id)],
                             cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc = None
    try:
        assert node1.stdout is not None and node1.stdout.readline().strip() == "READY"
        # node 0's block, as rank 0 (another process, on another host) made it
        block = new_block(engine_id, 2, ModeTable.uniform(Mode.ALL_GATHER).encode(), time.time_ns(), 4_000_000)
        planted = os.path.join(engine_dir(shm_dir, engine_id), CONTROL_NAME)
        if plant == "symlink":
            elsewhere = os.path.join(shm_dir, "node0-control")
            write_private_file(elsewhere, bytes(block))
            os.symlink(elsewhere, planted)
        else:
            write_private_file(planted, bytes(block))
        proc, url, api = sidecar_with_token(shm_dir)
        wait_for(lambda: api.get("/v1/engine").json()["ranks"] == [1], 120, "the node attached")
        wait_for(lambda: observer_role(url), 60, "the observer's role")
        put = api.put("/v1/mode", params={"wait": 5}, json={"mode": "gather"})
        assert put.status_code == 409, put.text
        assert observer_role(url)
        assert proc.stop() == 0, "".join(proc.output)
        assert "Traceback" not in "".join(proc.output)
    finally:
        if proc is not None and proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
        node1.communicate("", timeout=60)
