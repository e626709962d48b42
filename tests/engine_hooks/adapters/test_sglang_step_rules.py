"""What the SGLang step hooks decide from SGLang's batch and server state: features they do not cover (named, so
the hooks stay off with one warning), which logits calls they hook, the dtype of received ids, and which batches
sharded mode may take. The version and shape refusals shared with vLLM are in test_plugin_refusals.py.

Runs without SGLang: the server arguments and batches are faked, never SGLang.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gatherwise.engine_hooks.adapters.sglang import patches as sglang_patches
from gatherwise.engine_hooks.adapters.sglang.step import hookable, sampled_ids_dtype, unsupported_features

PLAIN = SimpleNamespace(speculative_algorithm=None, pp_size=1, enable_dp_attention=False, enable_dp_lm_head=False)
PARALLEL = SimpleNamespace(attn_dp_size=1, enable_dp_lm_head=False, enable_tp_lm_head_all_to_all=False)


@pytest.mark.parametrize("server,parallel,named", [
    ({}, {}, None),
    ({"speculative_algorithm": "EAGLE"}, {}, "speculative decoding (EAGLE)"),
    ({"pp_size": 2}, {}, "pipeline parallelism"),
    ({"enable_dp_attention": True}, {"attn_dp_size": 2}, "DP attention"),
    ({"enable_dp_lm_head": True}, {"enable_dp_lm_head": True}, "enable_dp_lm_head"),
    ({}, {"enable_tp_lm_head_all_to_all": True}, "all-to-all TP LM head"),
])
def test_unsupported_features_are_named(server, parallel, named):
    found = unsupported_features(SimpleNamespace(**(vars(PLAIN) | server)),
                                 SimpleNamespace(**(vars(PARALLEL) | parallel)))
    assert (found == []) if named is None else any(named in f for f in found), found


def _batch(mode: str, *, return_logprob: bool = False, prefill_only: bool = False,
           info: bool = True) -> SimpleNamespace:
    return SimpleNamespace(forward_mode=SimpleNamespace(name=mode), return_logprob=return_logprob,
                           is_prefill_only=prefill_only, sampling_info=SimpleNamespace() if info else None)


@pytest.mark.parametrize("batch,ok", [
    (_batch("DECODE"), True), (_batch("DECODE", return_logprob=True), True), (_batch("EXTEND"), True),
    (_batch("MIXED"), True), (_batch("EXTEND", return_logprob=True), False),
    (_batch("EXTEND", prefill_only=True), False), (_batch("TARGET_VERIFY"), False),
    (_batch("DRAFT_EXTEND_V2"), False), (_batch("IDLE"), False), (_batch("DECODE", info=False), False),
])
def test_only_calls_sglang_samples_right_after_are_hooked(batch, ok):
    assert hookable(batch) is ok


def test_received_ids_take_the_dtype_sglang_samples_in():
    import torch

    assert sampled_ids_dtype(SimpleNamespace(is_all_greedy=True)) == torch.int64
    assert sampled_ids_dtype(SimpleNamespace(is_all_greedy=False)) == torch.int32


def test_hooked_gatherer_delegates_everything_but_the_call():
    calls = []
    original = SimpleNamespace(max_tokens=128, __call__=None)

    def gather(processor, orig, logits):
        calls.append((processor, orig, logits))
        return "x"

    hooks = SimpleNamespace(gather=gather)
    wrapped = sglang_patches._HookedGatherer(original, "processor", hooks)
    assert wrapped("logits") == "x" and calls == [("processor", original, "logits")]
    assert wrapped.max_tokens == 128


def _greedy_batch(**info):
    fields = dict(is_all_greedy=True, penalizer_orchestrator=SimpleNamespace(is_required=False), logit_bias=None,
                  grammars=None, acc_additive_penalties=None, acc_scaling_penalties=None,
                  sampling_mask_batch_indices=None, has_custom_logit_processor=False, has_watermark_candidates=False)
    return_logprob = info.pop("return_logprob", False)
    return SimpleNamespace(sampling_info=SimpleNamespace(**(fields | info)), return_logprob=return_logprob)


@pytest.mark.parametrize("change,ok", [
    ({}, True), ({"is_all_greedy": False}, False), ({"return_logprob": True}, False),
    ({"penalizer_orchestrator": SimpleNamespace(is_required=True)}, False), ({"logit_bias": object()}, False),
    ({"grammars": [object()]}, False), ({"acc_additive_penalties": object()}, False),
    ({"has_custom_logit_processor": True}, False), ({"sampling_mask_batch_indices": object()}, False),
    ({"has_watermark_candidates": True}, False),
])
def test_sharded_only_where_sglangs_token_is_the_raw_argmax(change, ok):
    from gatherwise.engine_hooks.adapters.sglang.batch import sharded_greedy_ok

    assert sharded_greedy_ok(_greedy_batch(**change)) is ok


def _info(greedy=False, top_p=False, top_k=False, min_p=False):
    return SimpleNamespace(is_all_greedy=greedy, need_top_p_sampling=top_p, need_top_k_sampling=top_k,
                           need_min_p_sampling=min_p)


@pytest.mark.parametrize("info,logprob,kind", [
    (_info(greedy=True), False, "greedy"), (_info(greedy=True), True, "greedy+logprobs"),
    (_info(), False, "temperature"), (_info(top_k=True), False, "top_k"), (_info(min_p=True), False, "top_k"),
    (_info(top_p=True, top_k=True), True, "top_p+logprobs"),
])
def test_every_call_names_what_it_samples(info, logprob, kind):
    """The kind the ring record carries (the auto policy compares modes only on calls of one kind), from the
    batch's own flags; the vLLM adapter reads the same facts from its SamplingMetadata."""
    from gatherwise.call_kind import kind_label
    from gatherwise.engine_hooks.adapters.sglang.batch import call_kind_of
    from gatherwise.engine_hooks.adapters.vllm.v1_batch import call_kind_of as vllm_call_kind_of

    assert kind_label(call_kind_of(SimpleNamespace(sampling_info=info, return_logprob=logprob))) == kind
    metadata = SimpleNamespace(all_greedy=info.is_all_greedy, top_p=[0.9] if info.need_top_p_sampling else None,
                               top_k=[5] if info.need_top_k_sampling else None,
                               min_p=[0.1] if info.need_min_p_sampling else None,
                               max_num_logprobs=3 if logprob else None)
    assert kind_label(vllm_call_kind_of(metadata)) == kind
