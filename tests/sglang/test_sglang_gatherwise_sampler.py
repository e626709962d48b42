"""SGLang 0.5.23, TP=2 on CPU, with `engine.sampler: gatherwise`: sampled requests (top-p, top-k, min-p) draw the
same tokens alone and batched with others, in sharded, all_gather and gather, and across mode switches made
mid-generation through a real sidecar's HTTP API; sampled batches run sharded where the table says so; a
request with its own seed draws the same tokens in two runs of it (other request id, other batch, other mode);
batches with a penalty or logprobs keep SGLang's sampler (all_gather in a sharded table); every rank runs the
same mode per call.

One engine next to a sidecar, its own process (startup dominates; see engine_run_sampler for the phases), on the
tiny checkpoint with its logits scaled to a trained model's entropy (`peaked`); in the model matrix
(GATHERWISE_TRAINED_FULL=1) also on each trained model at its TP with its real prompts.
"""

from __future__ import annotations

import functools
import os
import shutil

import pytest

from gatherwise.bench.serve.engine_spec import core_per_rank
from gatherwise.engine_hooks.deferred_word import ADOPT_LAG
from gatherwise.modes import Mode
from gatherwise.tp_engine.trained_models import MODELS
from tests._engine_harness import assert_ranks_ran_the_same_calls, mode_runs, run_next_to_sidecar
from tests._trained_models import engine_models, full_matrix, model_directory
from tests.sglang.engine_run_sampler import OTHERS, REQUESTS, TOKENS
from tests.sglang.harness import base_env, phase_calls, run_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SAMPLED = [rid for rid, _, extra in REQUESTS if extra["temperature"] > 0]
BATCH_PHASES = ("batch_sharded", "batch_all_gather", "batch_gather")


SUBJECTS = ["tiny"] + (engine_models() if full_matrix() else [])


@pytest.fixture(scope="module", params=SUBJECTS)
def run(request: pytest.FixtureRequest) -> dict:
    """The run on the peaked tiny checkpoint (TP 2), or on a trained model at its TP with its real prompts."""
    tp, omp = 2, {}
    args: tuple[str, ...] = ()
    if request.param == "tiny":
        model = request.getfixturevalue("peaked")
    else:
        model, tp = str(model_directory(request.param)), MODELS[request.param].engine_tp
        # a trained model's weights need more of SGLang's static memory share than the tiny one's; ranks past the
        # second share the two cores and sleep rather than spin while they wait (docs/sglang.md, "On a CPU host")
        args = ("--tp", str(tp), "--mem-fraction-static", "0.2", "--real-prompts")
        omp = {"SGLANG_CPU_OMP_THREADS_BIND": core_per_rank(tp), "OMP_WAIT_POLICY": "PASSIVE"}
    shm = f"/dev/shm/gatherwise-sglang-sampler-test-{os.getpid()}-{os.urandom(4).hex()}"
    os.makedirs(shm)
    try:
        env = base_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm, GATHERWISE_ENGINE_INITIAL_MODE="sharded",
                       GATHERWISE_ENGINE_SAMPLER="gatherwise", GATHERWISE_ENGINE_SAMPLER_SEED="31", **omp)
        engine = functools.partial(run_engine, module="tests.sglang.engine_run_sampler")
        return {**run_next_to_sidecar(lambda *a: engine(*a, *args), model, shm, env), "tp": tp}
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def _modes(run: dict, phase: str) -> set[int]:
    return {c[1] for c in phase_calls(run, "0", phase)}


def test_requests_generate_and_sample(run):
    alone = run["alone_sharded"]
    assert all(len(alone[rid]) == TOKENS for rid, _, _ in REQUESTS)
    assert all(f"hooks installed on TP rank {r}/{run['tp']}" in run["log"] for r in range(run["tp"]))
    assert all(len(set(alone[rid])) > 1 for rid in SAMPLED)  # sampled text varies


@pytest.mark.parametrize("phase", BATCH_PHASES)
def test_a_request_draws_the_same_alone_and_batched_in_every_mode(run, phase):
    for rid, _, _ in REQUESTS:
        assert run[phase][rid] == run["alone_sharded"][rid], (phase, rid)
    for rid, _, _ in OTHERS:  # the requests only ever batched: the same in every mode
        assert run[phase][rid] == run["batch_sharded"][rid], (phase, rid)


def test_a_request_draws_the_same_across_switches_mid_generation(run):
    assert run["switches"] >= 3
    assert run["streamed_switch"] == run["alone_sharded"]["top-p"]
    runs = mode_runs(phase_calls(run, "0", "streamed_switch"))
    assert len(runs) >= 3 and {Mode.SHARDED, Mode.ALL_GATHER, Mode.GATHER} <= set(runs), runs


def test_a_seeded_request_draws_the_same_in_two_runs(run):
    assert run["seeded_batch"] == run["seeded_sharded"] and len(run["seeded_sharded"]) == TOKENS


def test_sampled_batches_run_sharded_where_the_table_says_so(run):
    for phase in ("alone_sharded", "batch_sharded", "seeded_sharded"):
        assert _modes(run, phase) == {Mode.SHARDED}, phase
    # the sidecar's commands take effect ADOPT_LAG calls after the call that carried them
    assert Mode.ALL_GATHER in _modes(run, "batch_all_gather") and Mode.GATHER in _modes(run, "batch_gather")
    gathered = phase_calls(run, "0", "batch_gather")[ADOPT_LAG + 1:]
    assert gathered and {c[1] for c in gathered} == {Mode.GATHER}
    assert all(p["status"] in (200, 202) for p in run["puts"]), run["puts"]


def test_batches_with_a_penalty_or_logprobs_keep_sglangs_sampler(run):
    assert _modes(run, "stepped_aside") == {Mode.ALL_GATHER}  # sharded table: SGLang's sampler needs all_gather
    aside = run["stepped_aside"]
    assert len(aside["penalty"]) == TOKENS and len(aside["logprobs"]) == TOKENS and aside["logprob_count"] > 0
    assert "sampled batches with penalties keep SGLang's sampler" in run["log"]
    assert "sampled batches with logprobs keep SGLang's sampler" in run["log"]


def test_every_rank_runs_the_same_mode_per_call(run):
    assert_ranks_ran_the_same_calls(run["rings"], run["tp"])
