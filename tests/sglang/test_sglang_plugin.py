"""SGLang 0.5.23, TP=2 on CPU, with the gatherwise plugin: the same greedy tokens as plain SGLang in every mode
(all_gather, gather, sharded) and across switches made through a real sidecar's HTTP API, mid-generation too;
the same sampled tokens as plain SGLang (fixed random_seed, one request at a time, where plain SGLang is
deterministic), across gather stretches where only rank 0 draws; every rank runs the same mode per call;
per-rank timings reach /metrics.

Two engines, each its own process, one at a time (startup dominates: each module-scoped fixture starts one):
plain SGLang, and SGLang with the plugin, starting in sharded, whose mode a `gatherwise sidecar` switches
between phases and between the chunks of a streamed generation (see engine_run for the phases).
"""

from __future__ import annotations

import os
import shutil

import pytest

from gatherwise.engine_hooks.deferred_word import ADOPT_LAG
from gatherwise.modes import Mode
from tests._engine_harness import assert_ranks_ran_the_same_calls, metric_samples, mode_runs, run_next_to_sidecar
from tests.sglang.harness import base_env, phase_calls, run_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

TOKEN_PHASES = ("greedy_sharded", "sampled_c", "streamed_sharded", "greedy_a", "greedy_b", "sampled_a", "sampled_b",
                "greedy_mixed", "streamed_greedy", "streamed_sampled")
SETTLE = ADOPT_LAG + 1  # a command rides in one call and every rank adopts it ADOPT_LAG calls later


@pytest.fixture(scope="module")
def plain(model: str) -> dict:
    return run_engine(model, base_env())


@pytest.fixture(scope="module")
def hooked(model: str) -> dict:
    shm = f"/dev/shm/gatherwise-sglang-test-{os.getpid()}-{os.urandom(4).hex()}"
    os.makedirs(shm)
    try:
        # sharded first (engine_run's phases): the table an engine starts with, then switched by the sidecar
        env = base_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm, GATHERWISE_ENGINE_INITIAL_MODE="sharded")
        return run_next_to_sidecar(run_engine, model, shm, env)
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_plain_sglang_generates(plain):
    assert len(plain["greedy_a"]) == 6 and all(plain["greedy_a"]) and "rings" not in plain
    assert plain["streamed_sampled"] != plain["streamed_greedy"]  # same prompt: the sampled phases do sample
    assert "hooks installed" not in plain["log"]  # installed as a plugin, but off without GATHERWISE_ENABLE


def test_plugin_installs_on_both_ranks(hooked):
    assert "hooks installed on TP rank 0/2" in hooked["log"] and "hooks installed on TP rank 1/2" in hooked["log"]
    assert "hooks stay off" not in hooked["log"] and "leaves SGLang untouched" not in hooked["log"]


@pytest.mark.parametrize("phase", TOKEN_PHASES)
def test_same_tokens_as_plain_sglang(plain, hooked, phase):
    assert hooked[phase] == plain[phase]


def test_logprobs_in_gather_mode_match_plain_sglang(plain, hooked):
    """Rank 0 computes the logprobs the client gets; the other ranks' placeholders never reach it."""
    assert hooked["logprobs"] == plain["logprobs"]
    assert {c[1] for c in phase_calls(hooked, "0", "logprobs")} == {Mode.GATHER}


def test_modes_follow_the_sidecar_commands(hooked):
    modes = {phase: [c[1] for c in phase_calls(hooked, "0", phase)] for phase in hooked["marks"]}
    assert set(modes["greedy_sharded"]) == {Mode.SHARDED}
    assert set(modes["sampled_c"]) == {Mode.ALL_GATHER}  # sampled batches in a sharded bucket
    assert mode_runs(phase_calls(hooked, "0", "streamed_sharded")) == [Mode.SHARDED, Mode.ALL_GATHER]
    assert set(modes["greedy_a"]) == {Mode.ALL_GATHER}
    assert modes["greedy_b"][-1] == Mode.GATHER  # from the call after the one that carried the command
    assert set(modes["sampled_a"]) == {Mode.GATHER}  # sampled batches run gather too: only rank 0 draws
    assert modes["sampled_b"][-1] == Mode.ALL_GATHER and Mode.ALL_GATHER in modes["sampled_b"]
    # bucket-pinned table: batches of 1-2 rows gather, larger ones all_gather, within one generation
    mixed = phase_calls(hooked, "0", "greedy_mixed")[SETTLE:]
    assert mixed and all(mode == (Mode.GATHER if rows <= 2 else Mode.ALL_GATHER) for _, mode, rows, _ in mixed)
    assert {Mode.GATHER, Mode.ALL_GATHER} <= {c[1] for c in mixed}
    for phase in ("streamed_greedy", "streamed_sampled"):  # switched back and forth within one generation
        assert len(mode_runs(phase_calls(hooked, "0", phase))) >= 3, modes[phase]
    assert all(p["status"] in (200, 202) for p in hooked["puts"]), hooked["puts"]


def test_sampled_ranks_adopted_rank0_generator_state(hooked):
    """Each return from gather to a sampled all_gather call handed rank 0's generator state over."""
    assert "adopted rank 0's generator state" in hooked["log"]


def test_every_rank_runs_the_same_mode_per_call(hooked):
    assert_ranks_ran_the_same_calls(hooked["rings"])


def test_sidecar_metrics_show_per_rank_and_per_op_timings(hooked):
    metrics = hooked["metrics"]
    paths = metric_samples(metrics, "gatherwise_logits_path_seconds_count")  # per rank and mode
    counted = {(labels["rank"], labels["mode"]) for labels, value in paths if value > 0}
    for rank in ("0", "1"):
        assert {(rank, mode) for mode in ("all_gather", "gather", "sharded")} <= counted, paths
    samples = metric_samples(metrics, "gatherwise_collective_seconds_count")  # pooled over ranks, per op
    assert {"all_gather", "gather"} <= {labels["op"] for labels, value in samples if value > 0}, samples
