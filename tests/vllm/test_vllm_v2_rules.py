"""Which Model Runner V2 batches the adapter samples on the shards, which rank 0 alone may sample, and why the
others step aside — decided from a real V2 `Sampler` (vLLM's own class and request states, on this CPU; only the
step's input batch is reduced to the one field the rule reads, its request slots).

The engine runs in tests/vllm/test_vllm_model_runner_v2.py check the tokens; here the rules the engine runs there
cannot reach on this CPU (structured outputs, a soft cap, a custom logits processor, another sampler).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gatherwise.call_kind import Sampling, call_kind
from gatherwise.engine_hooks.adapters.vllm.v2_batch import v2_batch

VOCAB = 320
PLAIN = SimpleNamespace(soft_cap=None, scale=1.0)  # vLLM's LogitsProcessor attributes the rule reads


@pytest.fixture(scope="module")
def vllm_config(model):
    import vllm.v1.worker.cpu.shm  # noqa: F401  # vLLM's CPU buffers for V2's states (what a CPU worker imports)
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=model, skip_tokenizer_init=True, max_model_len=256, enforce_eager=True)
    return args.create_engine_config()


def sampler_with(vllm_config, *params, sampler_class=None, processors=()):
    """A real V2 Sampler with one request slot per SamplingParams."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.states import RequestState

    with set_current_vllm_config(vllm_config):
        states = RequestState(len(params), 256, 256, 0, VOCAB, torch.device("cpu"))
        sampler = (sampler_class or Sampler)(vllm_config, len(params), VOCAB, torch.device("cpu"), states,
                                             custom_logits_processors=processors)
        for slot, p in enumerate(params):
            sampler.add_request(slot, p)
    return sampler


def decide(sampler, processor=PLAIN, structured=False):
    slots = np.arange(sampler.sampling_states.max_num_reqs)
    return v2_batch(sampler, SimpleNamespace(idx_mapping_np=slots), processor, structured, len(slots))


def params(**kw):
    from vllm import SamplingParams

    return SamplingParams(**kw)


def test_temperature_and_the_native_processors_run_on_the_shards(vllm_config):
    batch = decide(sampler_with(vllm_config, params(temperature=0.8), params(temperature=0.7, seed=3),
                                params(temperature=0.8, presence_penalty=0.5, repetition_penalty=1.2),
                                params(temperature=0.9, logit_bias={5: 2.0}), params(temperature=0.0)))
    assert batch.sharded_reason is None and batch.gather_reason is None and not batch.raw_argmax
    assert batch.kind == call_kind(Sampling.TEMPERATURE)


def test_greedy_rows_nothing_rewrites_take_the_raw_argmax(vllm_config):
    assert decide(sampler_with(vllm_config, params(temperature=0.0), params(temperature=0.0))).raw_argmax
    penalized = decide(sampler_with(vllm_config, params(temperature=0.0), params(temperature=0.0,
                                                                                 frequency_penalty=1.0)))
    assert not penalized.raw_argmax and penalized.sharded_reason is None  # V2's own code on the shards


@pytest.mark.parametrize(("kw", "reason"), [
    (dict(top_p=0.9), "top-k, top-p or min-p"), (dict(top_k=5), "top-k, top-p or min-p"),
    (dict(min_p=0.1), "top-k, top-p or min-p"), (dict(logprobs=2), "logprobs")])
def test_what_needs_the_whole_row_steps_aside_from_sharded_only(vllm_config, kw, reason):
    batch = decide(sampler_with(vllm_config, params(temperature=0.8), params(temperature=0.8, **kw)))
    assert batch.sharded_reason == reason and batch.gather_reason is None


def test_structured_outputs_and_a_soft_cap_step_aside_from_sharded(vllm_config):
    sampler = sampler_with(vllm_config, params(temperature=0.0))
    assert decide(sampler, structured=True).sharded_reason == "structured outputs"
    capped = decide(sampler, processor=SimpleNamespace(soft_cap=30.0, scale=1.0))
    assert capped.sharded_reason == "logit soft cap or scale" and not capped.raw_argmax
    assert decide(sampler, structured=True).gather_reason is None  # rank 0 applies the mask to the full logits


def test_a_custom_logits_processor_keeps_v2s_full_row_sampler_on_every_rank(vllm_config):
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor

    class BanToken(LogitsProcessor):  # what a user plugs in: it may look at the whole row and keep state
        def __init__(self) -> None:  # needs none of vLLM's request state
            pass

        def add_request(self, req_idx, sampling_params):
            return req_idx == 1

        def apply(self, logits, ctx):
            logits[:, 7] = float("-inf")
            return logits

    sampler = sampler_with(vllm_config, params(temperature=0.8), params(temperature=0.8), processors=[BanToken()])
    batch = decide(sampler)
    assert batch.sharded_reason == batch.gather_reason == "custom logits processor"


def test_another_sampler_class_steps_aside_everywhere(vllm_config):
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    class WatermarkingSampler(Sampler):  # vLLM's watermark and models' custom samplers subclass V2's Sampler
        pass

    batch = decide(sampler_with(vllm_config, params(temperature=0.8), sampler_class=WatermarkingSampler))
    assert batch.sharded_reason is not None and batch.sharded_reason == batch.gather_reason


def test_a_fused_top_p_sampler_keeps_every_rank_drawing(vllm_config):
    """On a GPU build with FlashInfer (stand-in: the flag V2 sets there), top-k/top-p batches may be drawn from a
    device generator, which a rank skipping the draw would leave behind: they run all_gather in a gather table."""
    sampler = sampler_with(vllm_config, params(temperature=0.8, top_p=0.9), params(temperature=0.8))
    assert decide(sampler).gather_reason is None
    sampler.use_flashinfer = True
    assert "fused top-k/top-p" in decide(sampler).gather_reason
    only_temperature = sampler_with(vllm_config, params(temperature=0.8))
    only_temperature.use_flashinfer = True
    assert decide(only_temperature).gather_reason is None  # V2's keyed draw: nothing to keep in step
