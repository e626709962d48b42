"""An engine process whose hooks are off says so to the sidecar: its hooks-off notice lives exactly as long as the
process, and a real `gatherwise sidecar` shows it in /metrics, GET /v1/engine and /readyz, then forgets it.

The engine processes here are real processes that publish through the adapters' own reporter
(gatherwise.engine_hooks.adapters.hooks_off), the way vLLM's and SGLang's workers do when their hooks refuse.
"""

from __future__ import annotations

import os

import httpx

from gatherwise.shm_format.hooks_off import MAX_NOTICE_BYTES, HooksOffNotice, read_notices
from tests._hooks_off import DETAIL, start_reporter, stop
from tests._sidecar import start_sidecar, total, wait_for


def test_a_notice_lives_as_long_as_its_process(tmp_path):
    shm = str(tmp_path / "shm")
    proc = start_reporter(shm)
    try:
        (notice,) = read_notices(shm)
        assert (notice.engine, notice.reason, notice.tp_rank) == ("vLLM", "unsupported_feature", 0)
        assert notice.pid == proc.pid
        assert notice.detail == DETAIL
        assert oct(os.stat(os.path.join(shm, os.listdir(shm)[0])).st_mode & 0o777) == "0o600"
    finally:
        err = stop(proc)
    assert err.count("WARNING:gatherwise.vllm:gatherwise: vLLM builds Model Runner V2") == 1  # said once
    assert read_notices(shm) == [] and os.listdir(shm) == []  # its lock was freed: the reader removed it


def test_foreign_files_are_not_notices(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o700)
    (shm / "hooks-off-1-big.json").write_bytes(b" " * (MAX_NOTICE_BYTES + 1))
    (shm / "hooks-off-2-garbage.json").write_bytes(b"\xff{not json")
    (shm / "hooks-off-3-wrong.json").write_text('{"format": 1, "engine": "other", "reason": 1}')
    os.symlink("/etc/passwd", shm / "hooks-off-4-link.json")
    os.mkfifo(shm / "hooks-off-5-fifo.json")
    assert read_notices(shm, remove_dead=False) == []


def test_notice_fields_are_checked():
    good = HooksOffNotice("SGLang", "unsupported_feature", "speculative decoding", 7, None, 1).to_json()
    assert HooksOffNotice.from_json(good).reason == "unsupported_feature"
    renamed = good.replace(b"unsupported_feature", b"from_the_future")
    assert HooksOffNotice.from_json(renamed).reason == "other"  # a label value the sidecar knows, never a new one


def test_sidecar_shows_an_engine_whose_hooks_are_off(tmp_path):
    shm = str(tmp_path / "shm")
    proc = start_reporter(shm)
    sidecar, url = start_sidecar(shm)
    try:
        metrics = wait_for(lambda: (t := httpx.get(f"{url}/metrics", timeout=5).text) and
                           total(t, "gatherwise_engine_hooks_off", engine_kind="vLLM",
                                 reason="unsupported_feature") == 1 and t, 30, "the hooks-off series")
        assert "gatherwise_engine_hooks_off" in metrics
        info = httpx.get(f"{url}/v1/engine", timeout=5).json()
        assert info["attached"] is False
        assert [(n["engine"], n["reason"], n["pid"]) for n in info["hooks_off"]] == [("vLLM", "unsupported_feature",
                                                                                        proc.pid)]
        ready = httpx.get(f"{url}/readyz", timeout=5)
        assert ready.status_code == 503
        assert "hooks are off in vLLM process" in ready.json()["reason"] and "Model Runner V2" in ready.json()["reason"]
        stop(proc)
        wait_for(lambda: httpx.get(f"{url}/v1/engine", timeout=5).json()["hooks_off"] == [], 30,
                 "the notice of the exited process to go")
        assert total(httpx.get(f"{url}/metrics", timeout=5).text, "gatherwise_engine_hooks_off") == 0
        assert os.listdir(shm) == []
    finally:
        if proc.poll() is None:
            stop(proc)
        sidecar.stop()
