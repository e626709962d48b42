"""The SGLang plugin refuses an SGLang it does not know, and the hooks refuse features they do not cover: hooks
off, SGLang untouched, one clear warning.

Runs without SGLang: the version lookup, the class shapes and the server arguments are faked, never SGLang.
"""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest

from engine_hooks.adapters import sglang_patches, sglang_plugin
from engine_hooks.adapters.sglang_step import hookable, sampled_ids_dtype, unsupported_features


@pytest.fixture
def fresh_plugin(monkeypatch):
    monkeypatch.setattr(sglang_plugin, "_registered", False)
    monkeypatch.setenv("GATHERWISE_ENABLE", "1")
    yield
    sglang_patches._registered.clear()


def _no_register(hooks):
    raise AssertionError("SGLang must not be patched")


def test_unknown_version_leaves_sglang_untouched_with_one_warning(fresh_plugin, monkeypatch, caplog):
    monkeypatch.setattr(sglang_patches, "installed_sglang_version", lambda: "0.5.24")
    monkeypatch.setattr(sglang_patches, "register", _no_register)
    had_sglang = "sglang" in sys.modules
    with caplog.at_level(logging.WARNING, logger="gatherwise.sglang"):
        sglang_plugin.register()
        sglang_plugin.register()  # SGLang loads plugins in every process, and may do so more than once
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "SGLang 0.5.24 is not a version this adapter knows" in text and "0.5.23" in text
    assert "leaves SGLang untouched" in text
    assert not sglang_patches.registered()
    assert ("sglang" in sys.modules) == had_sglang  # the check stopped before importing any SGLang module


def test_missing_sglang_is_one_warning(fresh_plugin, monkeypatch, caplog):
    def missing():
        raise ModuleNotFoundError("No package metadata was found for sglang")

    monkeypatch.setattr(sglang_patches, "installed_sglang_version", missing)
    with caplog.at_level(logging.WARNING, logger="gatherwise.sglang"):
        sglang_plugin.register()
    assert len(caplog.records) == 1 and "SGLang is not installed" in caplog.records[0].getMessage()


def test_disabled_plugin_does_nothing(monkeypatch, caplog):
    monkeypatch.setattr(sglang_plugin, "_registered", False)
    monkeypatch.delenv("GATHERWISE_ENABLE", raising=False)
    monkeypatch.setattr(sglang_patches, "installed_sglang_version", lambda: pytest.fail("must not look at SGLang"))
    with caplog.at_level(logging.DEBUG, logger="gatherwise.sglang"):
        sglang_plugin.register()
    assert not caplog.records and not sglang_patches.registered()


@pytest.mark.parametrize("version,ok", [("0.5.23", True), ("0.5.23+cpu", True), ("0.5.23.post1", True),
                                        ("0.5.2", False), ("0.5.230", False), ("0.5.24", False),
                                        ("0.6.0", False), ("unknown", False)])
def test_version_supported(version, ok):
    assert sglang_patches.version_supported(version) is ok


class _Sampler:
    def forward(self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs,
                positions, *, logprob_logits=None):
        return None

    def _sync_token_ids_across_tp(self, batch_next_token_ids, sampling_info):
        return None


class _RenamedSampler(_Sampler):
    def forward(self, logits, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions):
        return None  # an SGLang where the first parameter was renamed


def test_shape_check_names_what_changed():
    classes = {sglang_patches.SAMPLER_FORWARD: _Sampler, sglang_patches.SYNC_TOKEN_IDS: _Sampler}
    assert sglang_patches.target_problems(classes) == []
    classes[sglang_patches.SAMPLER_FORWARD] = _RenamedSampler
    problems = sglang_patches.target_problems(classes)
    assert len(problems) == 1 and "Sampler.forward" in problems[0] and "logits_output" in problems[0]
    classes[sglang_patches.SYNC_TOKEN_IDS] = object
    assert any("_sync_token_ids_across_tp is missing" in p for p in sglang_patches.target_problems(classes))


def test_shape_problem_also_refuses(fresh_plugin, monkeypatch, caplog):
    monkeypatch.setattr(sglang_patches, "compatibility_problems",
                        lambda: ["sglang.srt.layers.sampler.Sampler.forward is missing"])
    monkeypatch.setattr(sglang_patches, "register", _no_register)
    with caplog.at_level(logging.WARNING, logger="gatherwise.sglang"):
        sglang_plugin.register()
    assert len(caplog.records) == 1 and "Sampler.forward is missing" in caplog.records[0].getMessage()


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


def _batch(mode: str, *, return_logprob=False, prefill_only=False, info=True):
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
    hooks = SimpleNamespace(gather=lambda processor, orig, logits: calls.append((processor, orig, logits)) or "x")
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
    from engine_hooks.adapters.sglang_step import sharded_greedy_ok

    assert sharded_greedy_ok(_greedy_batch(**change)) is ok
