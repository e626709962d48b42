"""A root sidecar and files of another uid in a root-owned engine directory (a rank info file, the saved state)
and in shm_dir (a hooks-off notice): as for rings and the control block, a file not owned by the directory's
owner (or by the sidecar's own user, who wrote it) is never read."""

from __future__ import annotations

import os

import pytest

from gatherwise.shm_format.control import SIDECAR_STATE_NAME
from gatherwise.shm_format.engine_info import RankInfo, info_path, read_rank_info
from gatherwise.shm_format.hooks_off import NoticeWriter
from gatherwise.shm_format.private_files import write_private_file
from gatherwise.shm_format.ring import engine_dir
from tests._sidecar import wait_for
from tests.faults._faults import NOBODY, assert_sidecar_serves, running_engine, sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
PLANTED = "planted by uid 65534"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the sidecar reads as root, the files belong to nobody")
def test_a_root_sidecar_reads_no_file_of_another_uid(shm_dir):
    engine, engine_id = running_engine(shm_dir)
    directory = engine_dir(shm_dir, engine_id)
    notices = NoticeWriter()
    first, _url, api = sidecar_with_token(shm_dir)
    proc = None
    try:
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the first sidecar attached")
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather", "buckets": [4]}).status_code == 200
        assert first.stop() == 0, "".join(first.output)
        state = os.path.join(directory, SIDECAR_STATE_NAME)
        os.chown(state, NOBODY, NOBODY)  # its decision log would be restored if the file were read
        info = wait_for(lambda: read_rank_info(directory, 0), 60, "rank 0's info file")
        forged = RankInfo(PLANTED, info.version, 0, info.node, info.pid, info.sampler)
        write_private_file(info_path(directory, 0), forged.to_json())
        os.chown(info_path(directory, 0), NOBODY, NOBODY)
        notice = notices.publish(shm_dir, "vLLM", "unsupported_version", PLANTED)
        assert notice is not None
        os.chown(notice, NOBODY, NOBODY)

        proc, _url, api = sidecar_with_token(shm_dir)
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "attached")
        assert api.get("/v1/decisions").json()["decisions"] == []  # the state file was not read
        live = api.get("/v1/live").json()
        assert live["engine"]["kind"] != PLANTED, live["engine"]
        assert all(n["detail"] != PLANTED for n in api.get("/v1/engine").json()["hooks_off"])
        assert all(n["detail"] != PLANTED for n in live["hooks_off"])
        assert os.path.exists(notice)  # not removed either: it is not the sidecar's to judge
        assert_sidecar_serves(proc, api)
        assert proc.stop() == 0, "".join(proc.output)
        assert f"owned by uid {NOBODY}" in "".join(proc.output)
    finally:
        for fd in notices._held.values():
            os.close(fd)
        for p in (first, proc):
            if p is not None and p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait(30)
        engine.stop()
