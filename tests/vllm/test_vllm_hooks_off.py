"""The vLLM plugin never goes off silently: a logits gather outside every hooked step is said once, by name, in
vLLM's log, and a real `gatherwise sidecar` shows the process with its reason.

Real vLLM classes in one process (tests/vllm/hooks_off_run.py); no engine needs to run.
"""

from __future__ import annotations

import functools

import pytest

from gatherwise.shm_format.hooks_off import read_notices
from tests._engine_harness import metric_samples, run_next_to_sidecar
from tests.vllm.harness import base_env, run_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def refused(model: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    shm = str(tmp_path_factory.mktemp("hooks-off") / "shm")
    env = base_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm)
    result = run_next_to_sidecar(functools.partial(run_engine, module="tests.vllm.hooks_off_run"), model, shm, env)
    result["live_after_exit"] = read_notices(shm)
    return result


def warnings_about(log: str, text: str) -> list[str]:
    return [line for line in log.splitlines() if "WARNING" in line and text in line]


def test_a_gather_outside_a_hooked_step_is_said_once(refused):
    assert refused["installed"] is True  # the patches were applied: the plugin is on
    assert len(refused["guard_errors"]) == 2  # vLLM's own collective ran (and failed without a TP group) twice
    (line,) = warnings_about(refused["log"], "logits gather ran outside a hooked step")
    assert "called from __main__.call_gather_outside_a_step" in line


def test_the_sidecar_shows_the_process_and_its_reasons(refused):
    view = refused["sidecar"]
    notices = view["engine"]["hooks_off"]
    assert view["engine"]["attached"] is False
    assert [n["reason"] for n in notices] == ["unhooked_logits_calls"]
    assert {n["engine"] for n in notices} == {"vLLM"}
    status, body = view["readyz"]
    assert status == 503 and "gatherwise hooks are off in vLLM process" in body["reason"]
    series = {labels["reason"]: value for labels, value in metric_samples(view["metrics"],
                                                                           "gatherwise_engine_hooks_off")}
    assert series == {"unhooked_logits_calls": 1.0}
    assert refused["live_after_exit"] == []  # the process ended: its notices are gone with it
