"""Concurrent PUT /v1/mode for the same bucket: a command is overwritten in place, so rank 0 may never read one
that a later request replaced. An answer that says "applied" must mean the engine runs what that request asked;
one whose command was replaced says so (409) and names the command that replaced it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from gatherwise.shm_format.control import seq_is_newer
from tests._sidecar import wait_for
from tests.faults._faults import running_engine, sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
REQUESTS = 40
MODES = ("gather", "sharded")


def test_a_replaced_command_is_never_answered_applied(shm_dir):
    engine, _engine_id = running_engine(shm_dir, duration=600)
    proc, _url, api = sidecar_with_token(shm_dir)
    try:
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached")

        def put(i: int) -> tuple[str, int, dict]:
            mode = MODES[i % 2]
            r = api.put("/v1/mode", params={"wait": 30}, json={"mode": mode, "buckets": [8]})
            return mode, r.status_code, r.json()

        with ThreadPoolExecutor(REQUESTS) as pool:
            answers = list(pool.map(put, range(REQUESTS)))
        assert all(status in (200, 409) for _, status, _ in answers), answers
        # what an "applied" answer says runs is what its request asked for
        said_applied = [(mode, body) for mode, status, body in answers if status == 200]
        assert said_applied  # the newest request at least ran
        assert [b for mode, b in said_applied if b["state"]["active"]["8"] != mode] == []
        seqs = {body["seq"] for _, _, body in answers}
        for _, status, body in answers:
            if status == 200:
                assert body["applied"] is True and body["superseded_by"] is None, body
            else:
                assert body["applied"] is False and body["apply_call"] is None, body
                newer = body["superseded_by"]
                assert newer in seqs and seq_is_newer(newer, body["seq"]), body
                assert body["detail"].startswith(f"superseded: command {newer} "), body
        assert engine.popen.poll() is None
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        for p in (engine, proc):
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait(30)
