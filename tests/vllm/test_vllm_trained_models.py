"""vLLM V1 on CPU with a trained model (SmolLM2-135M-Instruct at TP=3; Gemma-3-270M at TP=2 in the model matrix):
the plugin gives plain vLLM's tokens, logprobs and text on real text, in every mode and across mid-generation
switches through the engine's control block, for greedy, seeded top-p and structured requests (a regex and a JSON
schema, valid); every rank runs the same mode per call, and sharded greedy calls really ran sharded. In the model
matrix also `engine.sampler: gatherwise`: a batch of top-p, top-k, min-p, seeded and greedy requests draws the same
tokens under all_gather, gather, sharded and a mid-generation switch schedule, sharded batches running sharded;
and Model Runner V2 (vLLM's kernels under Triton's interpreter, tests/vllm/test_vllm_model_runner_v2.py): greedy
and keyed sampled requests (temperature only, seeded or not), stepped with flips, equal plain V2's in every round.

Two engines per model, one at a time (tests/vllm/sampled_run.py): plain vLLM, then the plugin. CI runs one round
(the sharded table) with greedy, structured and seeded phases and the stepped phase whose flips cross the modes;
`make test-models` (GATHERWISE_TRAINED_FULL=1) runs every round and phase for each model it names.
"""

from __future__ import annotations

import functools
import os
import re
import shutil

import pytest

from gatherwise.modes import Mode
from gatherwise.tp_engine.trained_models import MODELS
from tests._engine_harness import assert_ranks_ran_the_same_calls
from tests._trained_models import assert_schema_json, engine_models, full_matrix, model_directory
from tests.vllm.harness import base_env, run_engine
from tests.vllm.sampled_run import REGEX

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
RUN = "tests.vllm.sampled_run"
# three ranks on two cores: OpenMP threads that spin while they wait take the core a working rank needs (3.5x
# slower runs here), so they sleep instead (docs/vllm.md says to set it on CPU hosts); tokens are the same
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE"}
SHORT = ("--rounds", "sharded", "--phases", "greedy,structured,seeded", "--stepped", "stepped")
APPLY_DELAY = 2
# Model Runner V2 interprets vLLM's Triton kernels on this CPU: one run on Gemma's 262 144-column head takes longer
# than an engine run's usual bound on a shared 2-core host
V2_TIMEOUT_S = 2400


def _run(name: str, *extra: str, env: dict[str, str]) -> dict:
    args = ["--tp", str(MODELS[name].engine_tp), "--dtype", "float32", *(() if full_matrix() else SHORT), *extra]
    return run_engine(str(model_directory(name)), env, *args, module=RUN)


@pytest.fixture(scope="module", params=engine_models())
def runs(request: pytest.FixtureRequest) -> tuple[dict, dict, int]:
    """(plain vLLM, the plugin, TP) on one trained model."""
    name = request.param
    plain = _run(name, env=base_env(**IN_PROCESS))
    shm = f"/dev/shm/gatherwise-vllm-trained-{os.getpid()}"
    try:
        # the first round's table from the start: the control block that sets a round's table exists only once
        # the hooks installed, at the first logits call
        first = "all_gather" if full_matrix() else "sharded"
        ours = _run(name, "--shm-dir", shm, "--switch",
                    env=base_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm,
                                 GATHERWISE_ENGINE_INITIAL_MODE=first, **IN_PROCESS))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    return plain, ours, MODELS[name].engine_tp


@pytest.fixture(scope="module", params=engine_models())
def sampler_rounds(request: pytest.FixtureRequest) -> dict:
    """`engine.sampler: gatherwise` on one trained model: tests/vllm/gatherwise_sampler_run.py's rounds."""
    name = request.param
    shm = f"/dev/shm/gatherwise-vllm-trained-gws-{os.getpid()}"
    env = base_env(GATHERWISE_ENGINE_SHM_DIR=shm, GATHERWISE_ENGINE_SAMPLER_SEED="7", GATHERWISE_ENABLE="1",
                   GATHERWISE_ENGINE_SAMPLER="gatherwise", VLLM_DISABLE_REQUEST_ID_RANDOMIZATION="1", **IN_PROCESS)
    try:
        return run_engine(str(model_directory(name)), env, "--shm-dir", shm, "--tp", str(MODELS[name].engine_tp),
                          "--dtype", "float32", module="tests.vllm.gatherwise_sampler_run")
    finally:
        shutil.rmtree(shm, ignore_errors=True)


@pytest.mark.skipif(not full_matrix(), reason="the model matrix (make test-models) runs the gatherwise sampler")
def test_the_gatherwise_sampler_draws_alike_in_every_mode(sampler_rounds):
    batches = {name: sampler_rounds["rounds"][name]["batch"] for name in sampler_rounds["rounds"]}
    reference = batches["all_gather"]
    assert set(batches) == {"all_gather", "gather", "sharded", "switched"}
    for name, tokens in batches.items():
        assert tokens == reference, name
    assert sampler_rounds["rounds"]["sharded"]["alone"] == reference
    ring = {c[0]: c[1] for c in sampler_rounds["rings"]["0"]["calls"]}
    (batch,) = [p for p in sampler_rounds["phases"] if p["round"] == "sharded" and p["phase"] == "batch"]
    assert {ring[c] for c in range(batch["after"] + 1 + APPLY_DELAY, batch["last"] + 1)} == {Mode.SHARDED}


@pytest.fixture(scope="module", params=engine_models())
def v2_runs(request: pytest.FixtureRequest) -> tuple[dict, dict]:
    """(plain Model Runner V2, V2 with the plugin) on one trained model: greedy and keyed phases, every round."""
    from tests.vllm.test_vllm_model_runner_v2 import v2_env

    name = request.param
    args = ("--tp", str(MODELS[name].engine_tp), "--dtype", "float32", "--phases", "greedy,keyed", "--stepped",
            "stepped_keyed")
    run = functools.partial(run_engine, module=RUN, timeout_s=V2_TIMEOUT_S)
    plain = run(str(model_directory(name)), v2_env(OMP_WAIT_POLICY="PASSIVE"), *args)
    shm = f"/dev/shm/gatherwise-vllm-trained-v2-{os.getpid()}"
    try:
        plugin = v2_env(OMP_WAIT_POLICY="PASSIVE", GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm)
        ours = run(str(model_directory(name)), plugin, *args, "--shm-dir", shm, "--switch")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    return plain, ours


@pytest.mark.skipif(not full_matrix(), reason="the model matrix (make test-models) runs Model Runner V2")
def test_model_runner_v2_keyed_sampling_equals_plain(v2_runs):
    plain, ours = v2_runs
    assert ours["rounds"] == plain["rounds"]
    modes = {c[1] for c in ours["rings"]["0"]["calls"]}
    assert Mode.SHARDED in modes, modes  # keyed temperature batches sample on the shards


def test_every_phase_gives_plain_vllms_tokens(runs):
    plain, ours, _ = runs
    assert len(ours["rounds"]) == len(plain["rounds"])
    for mine, theirs in zip(ours["rounds"], plain["rounds"], strict=True):
        assert set(mine) == set(theirs)
        for phase in theirs:
            assert mine[phase] == theirs[phase], phase


def test_real_text_and_valid_structured_outputs(runs):
    plain, _, _ = runs
    for tokens in plain["rounds"]:
        assert all(o["text"].strip() for o in tokens["greedy"])
        regex, _, schema = (o["text"] for o in tokens["structured"][:3])
        assert re.fullmatch(REGEX, regex), regex
        assert_schema_json(schema)


def test_every_mode_ran_and_ranks_agree(runs):
    _, ours, tp = runs
    assert_ranks_ran_the_same_calls(ours["rings"], tp)
    modes = {c[1] for c in ours["rings"]["0"]["calls"]}
    assert {Mode.ALL_GATHER, Mode.GATHER, Mode.SHARDED} <= modes, modes
    (greedy,) = [p for p in ours["phases"] if p["round"] == "sharded" and p["phase"] == "greedy"]
    ring = {c[0]: c[1] for c in ours["rings"]["0"]["calls"]}
    first = -1 if greedy["after"] is None else greedy["after"] + APPLY_DELAY  # the engine starts sharded
    assert {ring[c] for c in range(first + 1, greedy["last"] + 1)} == {Mode.SHARDED}
    assert "hooks stay off" not in ours["log"]
