"""vLLM TP=2 on CPU, the traffic users send: structured outputs, sampled (unseeded and seeded), mixed greedy and
sampled batches, logprobs and prompt logprobs, stepped with mid-generation mode flips. With the plugin, each
round runs under another table (all_gather, gather, sharded) and the flips cross all three modes; every token,
logprob and text equals plain vLLM's, every rank runs the same mode per call, and each call ran the mode the
rules say (sampled traffic in gather; structured steps stepping aside from sharded, recorded as all_gather).

Two engines, one at a time (tests/vllm/sampled_run.py): plain vLLM and the plugin, same requests, same rounds.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

from gatherwise.modes import Mode
from tests._engine_harness import assert_ranks_ran_the_same_calls
from tests.vllm.harness import base_env, run_engine
from tests.vllm.sampled_run import CHOICE, REGEX, ROUNDS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
RUN = "tests.vllm.sampled_run"
# one model step per engine.step(), in both engines alike (the stepped phases flip the mode between steps)
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
SAMPLED_PHASES = ("sampled", "seeded", "mixed", "logprobs")
APPLY_DELAY = 2  # a command is on the wire at rank 0's next call and every rank runs it two calls later


@pytest.fixture(scope="module")
def plain(model_with_tokenizer: str) -> dict:
    return run_engine(model_with_tokenizer, base_env(**IN_PROCESS), module=RUN)


@pytest.fixture(scope="module")
def switched(model_with_tokenizer: str) -> dict:
    shm = f"/dev/shm/gatherwise-vllm-sampled-{os.getpid()}"
    env = base_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm, **IN_PROCESS)
    try:
        return run_engine(model_with_tokenizer, env, "--shm-dir", shm, "--switch", module=RUN)
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def phase_modes(result: dict, round_name: str, phase: str) -> list[int]:
    """Rank 0's mode of every call of one phase, past the calls that still ran the previous table."""
    (entry,) = [p for p in result["phases"] if p["round"] == round_name and p["phase"] == phase]
    modes = {c[0]: c[1] for c in result["rings"]["0"]["calls"]}
    return [modes[c] for c in range(entry["after"] + 1 + APPLY_DELAY, entry["last"] + 1)]


@pytest.mark.parametrize("round_index", range(len(ROUNDS)), ids=ROUNDS)
def test_every_phase_gives_plain_vllms_tokens(plain, switched, round_index):
    ours, theirs = switched["rounds"][round_index], plain["rounds"][round_index]
    assert set(ours) == set(theirs)
    for phase in theirs:
        assert ours[phase] == theirs[phase], f"round {ROUNDS[round_index]}, phase {phase}"


def test_structured_outputs_are_valid(plain):
    for tokens in plain["rounds"]:
        regex, choice, schema = (o["text"] for o in tokens["structured"][:3])
        assert re.fullmatch(REGEX, regex) and choice in CHOICE
        # a prefix of the schema's object (a random model pads it with the whitespace JSON allows until max_tokens)
        assert re.fullmatch(r'\{[\s"n:\d}-]*', schema), repr(schema)


def test_sampled_traffic_runs_gather_in_a_gather_table(switched):
    for phase in SAMPLED_PHASES:
        modes = phase_modes(switched, "gather", phase)
        assert modes and set(modes) == {Mode.GATHER}, phase


def test_structured_steps_step_aside_from_sharded_and_say_so(switched):
    modes = phase_modes(switched, "sharded", "structured")
    assert modes and set(modes) == {Mode.ALL_GATHER}  # recorded as what ran: vLLM's all_gather
    assert set(phase_modes(switched, "gather", "structured")) == {Mode.GATHER}  # gather applies the mask exactly


def test_flips_cross_gather_and_all_gather_mid_generation(switched):
    for round_name in ROUNDS:
        for phase in ("stepped", "stepped_structured"):
            assert {Mode.GATHER, Mode.ALL_GATHER} <= set(phase_modes(switched, round_name, phase)), (round_name, phase)
    # ranks that skipped draws in gather calls took rank 0's generator states before they drew again
    assert "TP rank 1 adopted rank 0's generator state" in switched["log"]


def test_every_rank_runs_the_same_mode_per_call(switched):
    assert_ranks_ran_the_same_calls(switched["rings"])


def test_no_logits_call_bypasses_the_hooks(switched):
    # warm-up and prompt logprobs are vLLM's own logits calls outside a step: they say nothing
    assert "logits gather ran outside a hooked step" not in switched["log"]
    assert "hooks stay off" not in switched["log"]
