"""vLLM TP=2 on CPU with the gatherwise plugin: same greedy tokens as plain vLLM in every mode and across switches
made through the sidecar's HTTP API; per-rank timings reach /metrics; every rank runs the same mode per call.

Three engines, each its own process, one at a time: plain vLLM; the plugin starting in gather mode; the plugin
starting in all_gather mode with a real `gatherwise sidecar` that flips the mode mid-generation.
"""

from __future__ import annotations

import os
import shutil

import pytest

from gatherwise.modes import Mode
from tests._engine_harness import assert_ranks_ran_the_same_calls, metric_samples, mode_runs, run_next_to_sidecar
from tests.vllm.harness import base_env, run_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def shm_root():
    path = f"/dev/shm/gatherwise-vllm-test-{os.getpid()}"
    os.makedirs(path, exist_ok=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def plain(model: str) -> dict:
    return run_engine(model, base_env())


@pytest.fixture(scope="module")
def gather_run(model: str, shm_root: str) -> dict:
    shm = os.path.join(shm_root, "gather")
    env = base_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm, GATHERWISE_ENGINE_INITIAL_MODE="gather")
    return run_engine(model, env, "--shm-dir", shm)


@pytest.fixture(scope="module")
def sharded_run(model: str, shm_root: str) -> dict:
    """Starts in sharded mode; after the greedy and seeded phases the table is flipped across all three modes
    through the engine's control block (in-process engine core, so each step is one model step)."""
    shm = os.path.join(shm_root, "sharded")
    env = base_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm, GATHERWISE_ENGINE_INITIAL_MODE="sharded",
                   VLLM_ENABLE_V1_MULTIPROCESSING="0")
    return run_engine(model, env, "--shm-dir", shm, "--control-switch")


@pytest.fixture(scope="module")
def switched_run(model: str, shm_root: str) -> dict:
    shm = os.path.join(shm_root, "switched")
    os.makedirs(shm, exist_ok=True)
    # In-process engine core: each LLMEngine.step() is one model step, so the switches land mid-generation.
    env = base_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    return run_next_to_sidecar(run_engine, model, shm, env)


def test_plain_vllm_generates(plain):
    assert len(plain["greedy"]) == 6 and all(plain["greedy"]) and "rings" not in plain


def test_gather_mode_gives_vllms_greedy_tokens(plain, gather_run):
    assert gather_run["greedy"] == plain["greedy"]
    rings = gather_run["rings"]
    assert sorted(rings) == ["0", "1"]
    # the greedy and the seeded phase both in gather mode: rank 0 samples seeded requests too
    assert mode_runs(rings["0"]["calls"]) == [Mode.GATHER]


def test_sharded_mode_gives_vllms_greedy_tokens(plain, sharded_run):
    assert sharded_run["greedy"] == plain["greedy"]
    rings = sharded_run["rings"]
    assert sorted(rings) == ["0", "1"]
    # greedy phase sharded; the seeded phase is not all-greedy, so it runs all_gather; then sharded again until
    # the control-block switches: gather, sharded, all_gather, sharded
    assert mode_runs(rings["0"]["calls"]) == [Mode.SHARDED, Mode.ALL_GATHER, Mode.SHARDED, Mode.GATHER,
                                              Mode.SHARDED, Mode.ALL_GATHER, Mode.SHARDED]


def test_switches_across_three_modes_keep_vllms_greedy_tokens(plain, sharded_run):
    cs = sharded_run["control_switched"]
    assert [c["mode"] for c in cs["commands"]] == ["gather", "sharded", "all_gather", "sharded"]
    assert cs["tokens"] == plain["greedy"]  # plain == sharded == switched across the three modes


def test_seeded_sampling_unchanged_by_the_plugin(plain, gather_run, switched_run, sharded_run):
    assert gather_run["seeded"] == plain["seeded"]
    assert switched_run["seeded"] == plain["seeded"]
    assert sharded_run["seeded"] == plain["seeded"]


def test_all_gather_mode_gives_vllms_greedy_tokens(plain, switched_run):
    assert switched_run["greedy"] == plain["greedy"]


def test_switch_through_sidecar_api_mid_generation(plain, switched_run):
    sw = switched_run["switched"]
    assert [p["mode"] for p in sw["puts"]] == ["gather", "all_gather", "gather"]
    assert all(p["status"] in (200, 202) for p in sw["puts"]), sw["puts"]
    assert sw["tokens"] == plain["greedy"]  # the same prompts and lengths, greedy
    assert sw["mode"]["active"]["1"] == "gather"
    # all_gather for the greedy and seeded phases, then the three switches, each within one generation
    assert mode_runs(switched_run["rings"]["0"]["calls"]) == [Mode.ALL_GATHER, Mode.GATHER, Mode.ALL_GATHER,
                                                              Mode.GATHER]


@pytest.mark.parametrize("run", ["gather_run", "switched_run", "sharded_run"])
def test_every_rank_runs_the_same_mode_per_call(run, request):
    assert_ranks_ran_the_same_calls(request.getfixturevalue(run)["rings"])


def test_sidecar_metrics_show_per_rank_and_per_op_timings(switched_run):
    metrics = switched_run["switched"]["metrics"]
    paths = metric_samples(metrics, "gatherwise_logits_path_seconds_count")
    assert {"0", "1"} <= {labels["rank"] for labels, value in paths if value > 0}, paths
    samples = metric_samples(metrics, "gatherwise_collective_seconds_count")  # pooled over ranks, per op
    ops = {labels["op"] for labels, value in samples if value > 0}
    assert {"all_gather", "gather"} <= ops, ops
