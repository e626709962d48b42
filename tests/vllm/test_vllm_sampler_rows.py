"""Which sampled batches gatherwise's sampler takes in vLLM (`step_aside_reason`) and the rows it draws
(`sampler_rows`), on vLLM's real InputBatch, request states, SamplingParams and built-in logits processors: the
sampling metadata is the one vLLM's runner builds for a step. No engine starts here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from gatherwise.engine_hooks.adapters.sampler_rows import SEEDED_REQUEST
from gatherwise.engine_hooks.adapters.vllm.v1_sampler_rows import sampler_rows, step_aside_reason
from gatherwise.engine_hooks.sampling_params import SamplingParams as Params
from gatherwise.stable_hash import stable_hash

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

VOCAB = 1000
SAMPLER_SEED = 11


def vllm_batch(*params: SamplingParams,
               outputs: tuple[int, ...] | None = None) -> tuple[InputBatch, dict[str, CachedRequestState]]:
    """vLLM's InputBatch holding one request per SamplingParams (request i produced outputs[i] tokens so far),
    refreshed as the runner refreshes it before a step; returns (batch, request states by id)."""
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    device = torch.device("cpu")
    config = VllmConfig()
    procs = LogitsProcessors(cls(config, device, False) for cls in BUILTIN_LOGITS_PROCESSORS)
    batch = InputBatch(max_num_reqs=8, max_model_len=64, max_num_batched_tokens=64, device=device, vocab_size=VOCAB,
                       block_sizes=[16], max_num_blocks_per_req=[4], logitsprocs=procs)
    requests = {}
    for i, p in enumerate(params):
        produced = outputs[i] if outputs else 0
        state = CachedRequestState(req_id=f"req-{i}", prompt_token_ids=[1, 2, 3], mm_features=[], sampling_params=p,
                                   generator=None, block_ids=([0],), num_computed_tokens=3 + produced,
                                   output_token_ids=[5] * produced)
        requests[state.req_id] = state
        batch.add_request(state)
    batch.refresh_metadata()
    return batch, requests


def reason(*params: SamplingParams, structured: bool = False, processor: LogitsProcessor | None = None) -> str | None:
    batch, _ = vllm_batch(*params)
    return step_aside_reason(batch.sampling_metadata, processor, structured)


def test_rows_carry_the_requests_parameters_seed_and_output_position():
    from vllm import SamplingParams

    batch, requests = vllm_batch(SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=0.0),
                                 SamplingParams(temperature=0.7, top_k=20, seed=1234),
                                 SamplingParams(temperature=0.9, top_k=-1, min_p=0.05),
                                 SamplingParams(temperature=0.6, top_k=VOCAB), outputs=(0, 3, 7, 1, 2))
    rows = sampler_rows(batch, requests, 5, SAMPLER_SEED)
    assert rows is not None
    top_p, greedy, seeded, min_p, top_k_off = rows
    assert top_p.params == Params(temperature=0.8, top_p=0.95, seed=SAMPLER_SEED)
    assert (top_p.request_id, top_p.position) == (stable_hash("req-0"), 0)
    assert greedy.params.greedy and greedy.position == 3
    assert seeded.params == Params(temperature=0.7, top_k=20, seed=1234)  # its own seed, not the sampler's
    assert (seeded.request_id, seeded.position) == (SEEDED_REQUEST, 7)
    assert min_p.params == Params(temperature=0.9, min_p=0.05, seed=SAMPLER_SEED)  # top_k -1: off
    assert top_k_off.params == Params(temperature=0.6, seed=SAMPLER_SEED)  # top_k at the vocab size: off


def test_rows_need_one_logits_row_per_request():
    from vllm import SamplingParams

    batch, requests = vllm_batch(SamplingParams(temperature=0.8), SamplingParams(temperature=0.8))
    assert sampler_rows(batch, requests, 3, SAMPLER_SEED) is None


def test_temperature_top_k_top_p_and_min_p_batches_go_to_gatherwise():
    from vllm import SamplingParams

    assert reason(SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=0.0),
                  SamplingParams(temperature=0.8, top_k=20, min_p=0.1, seed=3)) is None
    # logit bias and min-tokens idle: built-ins with nothing to do this step
    assert reason(SamplingParams(temperature=0.8, min_tokens=0, logit_bias={})) is None


@pytest.mark.parametrize(("extra", "why"), [
    ({"repetition_penalty": 1.3}, "penalties"), ({"frequency_penalty": 0.5}, "penalties"),
    ({"presence_penalty": 0.5}, "penalties"), ({"logprobs": 2}, "logprobs"), ({"logprobs": 0}, "logprobs"),
    ({"logit_bias": {3: 2.0}}, "logit bias"), ({"min_tokens": 4, "stop_token_ids": [7]}, "min tokens"),
    ({"allowed_token_ids": [1, 2, 3]}, "allowed token ids"),
])
def test_what_gatherwise_does_not_apply_keeps_vllms_sampler(extra, why):
    from vllm import SamplingParams

    assert reason(SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=0.8, **extra)) == why


def test_bad_words_structured_outputs_and_soft_cap_keep_vllms_sampler():
    from vllm import SamplingParams

    bad_words = SamplingParams(temperature=0.8, bad_words=["x"])
    bad_words._bad_words_token_ids = [[4, 5]]  # what vLLM's front end fills in from its tokenizer
    assert reason(SamplingParams(temperature=0.8), bad_words) == "bad words"
    assert reason(SamplingParams(temperature=0.8), structured=True) == "structured outputs"
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    with set_current_vllm_config(VllmConfig()):  # vLLM's layers read it when built, as in a model's __init__
        soft_cap, scaled, plain = (LogitsProcessor(VOCAB, soft_cap=30.0), LogitsProcessor(VOCAB, scale=0.5),
                                   LogitsProcessor(VOCAB))
    assert reason(SamplingParams(temperature=0.8), processor=soft_cap) == "logit soft cap or scale"
    assert reason(SamplingParams(temperature=0.8), processor=scaled) == "logit soft cap or scale"
    assert reason(SamplingParams(temperature=0.8), processor=plain) is None
