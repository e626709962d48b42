"""The attached engine is SIGKILLed while an older directory whose liveness lock is held (a look-alike, or an
older engine) sits in shm_dir: the sidecar keeps showing the dead engine's last numbers (engine_up 0) until a
newer engine starts, as the docs say, and does not switch to the older one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gatherwise.shm_format.ring import engine_dir
from tests._processes import kill_tree
from tests._sidecar import ROOT, scrape, total, wait_for
from tests.faults._faults import running_engine, sidecar_with_token, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_killed_engine_is_not_replaced_by_an_older_one(shm_dir):
    older = subprocess.Popen([sys.executable, "-m", "tests.faults._writers", "full", shm_dir, "64"], cwd=ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    engine = proc = newer = None
    try:
        assert older.stdout is not None and older.stdout.readline().strip() == "READY"
        engine, engine_id = running_engine(shm_dir)
        label = f"{engine_id:016x}"
        proc, url, api = sidecar_with_token(shm_dir)
        wait_for(lambda: api.get("/v1/engine").json()["engine_id"] == label, 120, "the newest engine attached")
        wait_for(lambda: total(scrape(url), "gatherwise_calls_total", engine=label) > 0, 60, "its counters")
        kill_tree(engine.popen)
        # the discovery pass that finds its locks free removes its directory, and would attach another engine then
        wait_gone(engine_dir(shm_dir, engine_id))
        info = api.get("/v1/engine").json()
        assert info["engine_id"] == label and info["up"] is False, info
        text = scrape(url)
        assert total(text, "gatherwise_engine_up", engine=label) == 0
        assert total(text, "gatherwise_calls_total", engine=label) > 0  # its last numbers, still shown
        # a newer engine replaces it
        newer, newer_id = running_engine(shm_dir)
        wait_for(lambda: api.get("/v1/engine").json()["engine_id"] == f"{newer_id:016x}", 120, "the new engine")
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        for p in (engine, newer):
            if p is not None and p.popen.poll() is None:
                kill_tree(p.popen)
        if proc is not None and proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
        older.communicate("", timeout=60)
