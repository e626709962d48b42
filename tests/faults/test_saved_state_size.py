"""A valid sidecar-state.json far larger than any sidecar writes (57 MB of sample windows, as a process of the
engine's user could leave): the sidecar does not parse it, attaches from the control block at once, and never
holds the file's parsed form in memory."""

from __future__ import annotations

import json

import pytest

from tests._processes import vm_kib
from tests._sidecar import wait_for
from tests.faults._faults import assert_sidecar_serves, sidecar_with_token, state_saved_after_a_switch, write_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
HUGE_BYTES = 57 << 20
PEAK_RSS_KIB = 300 * 1024  # parsing the file took 625 MB resident; the sidecar itself needs about a third of this


def test_a_state_file_above_the_cap_is_not_parsed(shm_dir):
    engine, state_path, doc = state_saved_after_a_switch(shm_dir)
    proc = None
    try:
        sample = [1000.123456789, 0.000123456789]
        per_window = HUGE_BYTES // (16 * 2 * len(json.dumps(sample)))
        doc["estimates"] = {f"{b}:{m}": [sample] * per_window for b in range(16) for m in ("all_gather", "gather")}
        text = json.dumps(doc)
        assert len(text) > 50 << 20
        write_state(state_path, text)
        del doc, text

        proc, _url, api = sidecar_with_token(shm_dir)
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "control attached")
        assert api.get("/v1/mode").status_code == 200
        assert_sidecar_serves(proc, api)
        assert vm_kib(proc.popen.pid, "VmHWM") < PEAK_RSS_KIB
        assert proc.stop() == 0, "".join(proc.output)
        output = "".join(proc.output)
        assert f"{state_path}: not read" in output and "Traceback" not in output, output
    finally:
        if proc is not None and proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
        engine.stop()
