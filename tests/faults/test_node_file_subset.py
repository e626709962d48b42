"""A node file that names a subset of the ranks (`[0]`) in a single-node engine's directory that holds every
rank's ring: the sidecar attaches to every rank, as the docs say, and says once why it did not follow the file."""

from __future__ import annotations

import os

import pytest

from gatherwise.shm_format.node_ranks import write_node_ranks
from gatherwise.shm_format.ring import engine_dir
from tests._sidecar import wait_for
from tests.faults._faults import assert_sidecar_serves, running_engine, sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("garbage", [False, True])
def test_a_node_file_naming_a_subset_does_not_keep_the_sidecar_off_the_engine(shm_dir, garbage):
    engine, engine_id = running_engine(shm_dir)
    proc = None
    try:
        directory = engine_dir(shm_dir, engine_id)
        wait_for(lambda: os.path.exists(os.path.join(directory, "node.json")), 120, "the engine's node file")
        if garbage:
            with open(os.path.join(directory, "node.json"), "w") as f:
                f.write("{not json")
        else:
            write_node_ranks(directory, 2, (0,), 0, 2)
        proc, _url, api = sidecar_with_token(shm_dir)
        wait_for(lambda: api.get("/v1/engine").json()["ranks"] == [0, 1], 120, "every rank attached")
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "ready")
        assert_sidecar_serves(proc, api)
        assert proc.stop() == 0, "".join(proc.output)
        warnings = [line for line in proc.output if "WARNING" in line and "node file" in line]
        assert len(warnings) == 1, "".join(proc.output)
    finally:
        if proc is not None and proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
        engine.stop()
