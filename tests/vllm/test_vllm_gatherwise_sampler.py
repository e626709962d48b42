"""vLLM TP=2 on CPU with `engine.sampler: gatherwise`: sampled batches (top-p, top-k, min-p, seeded, greedy rows
among them) are sampled by gatherwise's own sampler in every mode, sharded included. Their tokens are identical
under all_gather, gather, sharded and a mid-generation switch schedule across the three, whether a request
runs alone or in a batch; a seeded request gives the same tokens in another engine run with another
engine.sampler_seed (unseeded ones follow that seed); the rings show sampled batches running sharded under a
sharded table, while a batch with a penalty or logprobs keeps vLLM's sampler and runs all_gather there.

Two engines, one at a time (tests/vllm/gatherwise_sampler_run.py): the full rounds, then one round again with
another sampler seed; both on the tiny checkpoint with its logits scaled to a trained model's entropy (`peaked`),
in float32: vLLM's CPU default for a float32 checkpoint is bfloat16, whose forward gives a row logits one
bfloat16 step (1/64 at these values) apart alone and in a batch, which no sampler can draw alike.
"""

from __future__ import annotations

import os
import shutil

import pytest

from gatherwise.modes import Mode
from tests._engine_harness import assert_ranks_ran_the_same_calls
from tests.vllm.gatherwise_sampler_run import REQUESTS, ROUNDS
from tests.vllm.harness import base_env, run_engine
from tests.vllm.test_vllm_sampled import phase_modes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
RUN = "tests.vllm.gatherwise_sampler_run"
SAMPLER_SEED = "7"
# one model step per engine.step(); request ids as given (the same request keeps its id, and key, every round)
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION": "1",
       "GATHERWISE_ENABLE": "1", "GATHERWISE_ENGINE_SAMPLER": "gatherwise"}


def run_with_sampler(model: str, sampler_seed: str, *args: str) -> dict:
    shm = f"/dev/shm/gatherwise-vllm-gwsampler-{os.getpid()}-{sampler_seed}"
    env = base_env(GATHERWISE_ENGINE_SHM_DIR=shm, GATHERWISE_ENGINE_SAMPLER_SEED=sampler_seed, **ENV)
    try:
        return run_engine(model, env, "--shm-dir", shm, "--dtype", "float32", *args, module=RUN)
    finally:
        shutil.rmtree(shm, ignore_errors=True)


@pytest.fixture(scope="module")
def rounds_run(peaked: str) -> dict:
    return run_with_sampler(peaked, SAMPLER_SEED)


@pytest.fixture(scope="module")
def other_seed_run(peaked: str) -> dict:
    return run_with_sampler(peaked, "8", "--rounds", "gather")


def test_sampled_tokens_are_the_same_in_every_mode_and_switch_schedule(rounds_run):
    batches = {name: rounds_run["rounds"][name]["batch"] for name in ROUNDS}
    reference = batches["all_gather"]
    assert set(reference) == set(REQUESTS) and all(len(t) == REQUESTS[n]["max_tokens"] for n, t in reference.items())
    for name, tokens in batches.items():
        assert tokens == reference, name


def test_a_request_draws_the_same_tokens_alone_as_in_a_batch(rounds_run):
    for round_name, result in rounds_run["rounds"].items():
        if "alone" in result:
            assert result["alone"] == rounds_run["rounds"]["all_gather"]["batch"], round_name


def test_a_seeded_request_is_keyed_by_its_seed_alone(rounds_run, other_seed_run):
    ours, other = rounds_run["rounds"]["all_gather"]["batch"], other_seed_run["rounds"]["gather"]["batch"]
    assert other["seeded"] == ours["seeded"] and other["greedy"] == ours["greedy"]
    # the others are keyed by engine.sampler_seed and their request id: another seed, other draws
    assert any(other[name] != ours[name] for name in ("top_p", "top_k", "min_p"))


def test_sampled_batches_run_the_tables_mode_sharded_included(rounds_run):
    for mode in (Mode.ALL_GATHER, Mode.GATHER, Mode.SHARDED):
        modes = phase_modes(rounds_run, mode.label, "batch")
        assert modes and set(modes) == {mode}, mode.label
    assert set(phase_modes(rounds_run, "sharded", "alone-top_p")) == {Mode.SHARDED}
    switched = phase_modes(rounds_run, "switched", "batch")
    assert set(switched) == {Mode.ALL_GATHER, Mode.GATHER, Mode.SHARDED}


def test_a_batch_with_a_penalty_or_logprobs_keeps_vllms_sampler(rounds_run):
    assert set(phase_modes(rounds_run, "sharded", "aside")) == {Mode.ALL_GATHER}  # recorded as what ran
    assert set(phase_modes(rounds_run, "gather", "aside")) == {Mode.GATHER}  # vLLM's sampler on rank 0
    for reason in ("penalties", "logprobs"):
        assert f"a sampled batch keeps vLLM's sampler ({reason})" in rounds_run["log"]


def test_every_rank_runs_the_same_mode_per_call(rounds_run):
    assert_ranks_ran_the_same_calls(rounds_run["rings"])
    assert "hooks stay off" not in rounds_run["log"]
    assert "logits gather ran outside a hooked step" not in rounds_run["log"]
