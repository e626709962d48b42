"""sidecar-state.json's `extra` (what the control session saves beside the policy) written with bad fields: a
restarted sidecar still attaches control, feeds its policy and serves, and says what it refused, never with a
traceback."""

from __future__ import annotations

import functools
import json

import httpx
import pytest

from tests._sidecar import wait_for
from tests.faults._faults import assert_sidecar_serves, sidecar_with_token, state_saved_after_a_switch, write_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BAD_EXTRAS = [
    {"last_call_index": "x", "switch_counts": {}},
    {"last_call_index": 1e18, "switch_counts": {}},
    {"last_call_index": 10**18, "switch_counts": {}},  # a valid integer, but a call the engine never started
    {"last_call_index": -1, "switch_counts": {"gather": 1}},
    {"last_call_index": -1, "switch_counts": {"all_gather|gather|manual": "x"}},
    {"last_call_index": -1, "switch_counts": {"all_gather|gather|manual": -5}},
    {"last_call_index": -1, "switch_counts": []},
    "x",
]


def ready(api: httpx.Client) -> bool:
    return api.get("/readyz").status_code == 200


def fed(api: httpx.Client) -> bool:
    return api.get("/v1/stats").json()["calls_observed"] > 0


def test_bad_fields_of_the_saved_extra_neither_block_control_nor_starve_the_policy(shm_dir):
    engine, state_path, saved = state_saved_after_a_switch(shm_dir)
    assert set(saved["extra"]) == {"last_call_index", "switch_counts"}
    try:
        for extra in BAD_EXTRAS:
            write_state(state_path, json.dumps({**saved, "extra": extra}))
            proc, _url, api = sidecar_with_token(shm_dir)
            try:
                wait_for(functools.partial(ready, api), 120, f"control attached with extra {extra}")
                assert api.get("/v1/mode").status_code == 200
                wait_for(functools.partial(fed, api), 120, f"the policy fed with extra {extra}")
                assert_sidecar_serves(proc, api)
                assert proc.stop() == 0, "".join(proc.output)
                output = "".join(proc.output)
                assert "Traceback" not in output, output
                assert f"{state_path}: " in output, output  # what was refused, said in its one warning
            finally:
                if proc.popen.poll() is None:
                    proc.popen.kill()
                    proc.popen.wait(30)
    finally:
        engine.stop()
