"""Reading HF config.json: every key of transformers' LlamaConfig and Qwen2Config decided, each unsupported one
refused by name, both RoPE layouts read alike, and the RoPE schedules equal to transformers' own."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gatherwise.tp_engine.hf_config import (
    IRRELEVANT_KEYS,
    READ_KEYS,
    REFUSED_UNLESS,
    UnsupportedConfig,
    config_from_hf,
    eos_token_ids,
    load_hf_config,
)
from gatherwise.tp_engine.rope import RopeConfig, attention_scaling, inverse_frequencies
from gatherwise.tp_engine.runner import ModelSpec
from tests._hf_checkpoints import TinyCheckpoint, build
from tests._repo import ROOT

LLAMA = dict(model_type="llama", vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
QWEN2 = dict(LLAMA, model_type="qwen2")


def _config_classes():
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config

    return {"llama": LlamaConfig, "qwen2": Qwen2Config, "gemma3_text": Gemma3TextConfig}


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gemma3_text"])
def test_every_key_transformers_knows_is_decided(model_type):
    cls = _config_classes()[model_type]
    keys = {f.name for f in dataclasses.fields(cls)} | set(cls().to_dict())
    decided = set(READ_KEYS[model_type]) | set(IRRELEVANT_KEYS) | set(REFUSED_UNLESS)
    assert sorted(keys - decided) == []


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_the_full_config_transformers_writes_is_read(model_type):
    cls = _config_classes()[model_type]
    raw = cls(**{k: v for k, v in LLAMA.items() if k != "model_type"}).to_dict()
    config = config_from_hf(raw)
    assert (config.vocab_size, config.num_heads, config.num_kv_heads, config.head_dim) == (101, 4, 2, 8)
    assert config.qkv_bias is (model_type == "qwen2") and not config.o_bias and not config.mlp_bias
    assert config.rope == RopeConfig("default", 10000.0) and config.sliding_windows == ()


def test_both_layouts_give_the_same_config():
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    new = config_from_hf(dict(LLAMA, rope_parameters=dict(rope, rope_theta=500000.0)))
    old = config_from_hf(dict(LLAMA, rope_theta=500000.0, rope_scaling=rope))
    legacy = config_from_hf(dict(LLAMA, rope_theta=500000.0, rope_scaling={"type": "llama3", **{
        k: v for k, v in rope.items() if k != "rope_type"}}))
    assert new == old == legacy
    assert new.rope.rope_type == "llama3" and new.rope.theta == 500000.0 and new.rope.factor == 8.0
    # a new-layout theta is not lost (theta 10000 was the old reading of it)
    assert config_from_hf(dict(LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 123.0})).rope.theta == 123
    # llama3/yarn without original_max_position_embeddings fall back to max_position_embeddings, as transformers
    yarn = config_from_hf(dict(LLAMA, max_position_embeddings=96, rope_parameters={"rope_type": "yarn", "factor": 2}))
    assert yarn.rope.original_max_position_embeddings == 96


def test_biases_and_sliding_windows_are_read():
    llama = config_from_hf(dict(LLAMA, attention_bias=True, mlp_bias=True))
    assert llama.qkv_bias and llama.o_bias and llama.mlp_bias
    qwen = config_from_hf(dict(QWEN2, num_hidden_layers=3, use_sliding_window=True, sliding_window=5,
                               max_window_layers=1))
    assert qwen.qkv_bias and not qwen.o_bias and qwen.sliding_windows == (None, 5, 5)
    explicit = config_from_hf(dict(QWEN2, use_sliding_window=True, sliding_window=3,
                                   layer_types=["sliding_attention", "full_attention"]))
    assert explicit.sliding_windows == (3, None)
    # Qwen2.5 configs carry a window with use_sliding_window false: full attention, as in transformers
    assert config_from_hf(dict(QWEN2, use_sliding_window=False, sliding_window=32768,
                               max_window_layers=0)).sliding_windows == ()


REFUSED = [
    (dict(LLAMA, model_type="mistral"), "model_type 'mistral' is not supported"),
    ({k: v for k, v in LLAMA.items() if k != "model_type"}, "model_type None is not supported"),
    (dict(LLAMA, quantization_config={"quant_method": "awq"}), "'quantization_config'"),
    (dict(LLAMA, auto_map={"AutoModel": "x.Y"}), "'auto_map'"),
    (dict(LLAMA, partial_rotary_factor=0.5), "'partial_rotary_factor'"),
    (dict(LLAMA, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
     "'rope_parameters.partial_rotary_factor'"),
    (dict(LLAMA, is_encoder_decoder=True), "'is_encoder_decoder'"),
    (dict(LLAMA, add_cross_attention=True), "'add_cross_attention'"),
    (dict(LLAMA, pruned_heads={"0": [1]}), "'pruned_heads'"),
    (dict(LLAMA, rope_interleaved=True), "'rope_interleaved'"),
    (dict(LLAMA, hidden_act="gelu"), "hidden_act 'gelu'"),
    (dict(LLAMA, some_new_switch=True), "config key 'some_new_switch' is not known"),
    (dict(LLAMA, use_sliding_window=True), "config key 'use_sliding_window' is not known to tp_engine for "
                                           "model_type 'llama' (it belongs to model_type 'qwen2')"),
    (dict(LLAMA, layer_types=["full_attention"] * 2), "config key 'layer_types' is not known"),
    (dict(QWEN2, attention_bias=True), "config key 'attention_bias' is not known to tp_engine for model_type "
                                       "'qwen2'"),
    (dict(QWEN2, mlp_bias=True), "config key 'mlp_bias' is not known"),
    (dict(LLAMA, original_max_position_embeddings=64), "config key 'original_max_position_embeddings' is not known"),
    (dict(LLAMA, rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "'rope_scaling.rope_type' = 'dynamic'"),
    (dict(LLAMA, rope_parameters={"rope_type": "longrope"}), "'rope_parameters.rope_type' = 'longrope'"),
    (dict(LLAMA, rope_parameters={"rope_type": "proportional"}), "'proportional' is not supported"),
    (dict(LLAMA, rope_scaling={"type": "su", "factor": 2.0}), "'rope_scaling.rope_type' = 'su'"),
    (dict(LLAMA, rope_parameters={"full_attention": {"rope_type": "default"}}), "RoPE per layer type"),
    (dict(LLAMA, rope_parameters={"rope_type": "linear"}), "'rope_parameters.factor' is required"),
    (dict(LLAMA, rope_parameters={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}),
     "'rope_parameters.low_freq_factor' is required"),
    (dict(LLAMA, rope_parameters={"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}),
     "'rope_parameters.low_freq_factor' is not a parameter of rope_type 'linear'"),
    (dict(LLAMA, rope_parameters={"rope_type": "default", "factor": 2.0}), "'rope_parameters.factor' is not a "
                                                                           "parameter of rope_type 'default'"),
    (dict(LLAMA, rope_parameters={"rope_type": "linear", "factor": "2"}), "'rope_parameters.factor' must be a "
                                                                          "finite number"),
    (dict(LLAMA, rope_parameters={"rope_type": "linear", "factor": -1.0}), "rope factor must be > 0"),
    (dict(LLAMA, rope_theta=10000.0, rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
     "'rope_theta' (10000.0) and 'rope_parameters.rope_theta' (500.0) disagree"),
    (dict(LLAMA, rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_parameters={"rope_type": "default"}),
     "'rope_parameters' {'rope_type': 'default'} and 'rope_scaling'"),
    (dict(LLAMA, rope_scaling={"rope_type": "linear", "type": "yarn", "factor": 2.0}), "disagree"),
    (dict(LLAMA, rope_scaling="linear"), "config key 'rope_scaling' must be an object"),
    (dict(LLAMA, attention_bias="yes"), "config key 'attention_bias' must be true or false"),
    (dict(LLAMA, vocab_size=101.5), "config key 'vocab_size' must be an integer"),
    (dict(QWEN2, use_sliding_window=True, sliding_window=None, layer_types=["sliding_attention"] * 2),
     "config key 'sliding_window' must be an integer >= 1"),
    (dict(QWEN2, use_sliding_window=False, layer_types=["full_attention", "sliding_attention"]),
     "'use_sliding_window' is false"),
    (dict(QWEN2, layer_types=["full_attention"]), "one type per layer (2)"),
    (dict(QWEN2, layer_types=["full_attention", "chunked_attention"]), "'chunked_attention'"),
]


@pytest.mark.parametrize("raw, message", REFUSED, ids=[m[:40] for _, m in REFUSED])
def test_unsupported_keys_are_refused_by_name(raw, message):
    with pytest.raises(UnsupportedConfig) as info:
        config_from_hf(raw)
    assert message in str(info.value)


def test_harmless_values_of_refusable_keys_pass():
    config_from_hf(dict(LLAMA, quantization_config=None, partial_rotary_factor=1.0, is_encoder_decoder=False,
                        pruned_heads={}, rope_interleaved=False, pretraining_tp=4, torch_dtype="bfloat16",
                        attention_dropout=0.1, bos_token_id=1, temperature=0.6, rope_scaling=None))


ROPES = [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 3.0, "original_max_position_embeddings": 64,
     "beta_fast": 8.0, "beta_slow": 2.0, "truncate": False},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
     "mscale": 1.0, "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
     "attention_factor": 1.3},
]


@pytest.mark.parametrize("rope", ROPES, ids=[f"{r['rope_type']}-{i}" for i, r in enumerate(ROPES)])
def test_rope_schedules_equal_transformers(rope):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = LlamaConfig(hidden_size=256, num_attention_heads=2, max_position_embeddings=131072,
                      rope_parameters=dict(rope)).to_dict()
    config = config_from_hf(raw)
    ours = inverse_frequencies(config.rope, config.head_dim)
    if rope["rope_type"] == "default":
        theirs = 1.0 / rope["rope_theta"] ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
        scale = 1.0
    else:
        theirs, scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](LlamaConfig(**{
            k: v for k, v in raw.items() if k not in ("model_type", "transformers_version")}), "cpu")
    torch.testing.assert_close(ours.to(torch.float32), theirs.to(torch.float32), rtol=2e-6, atol=0)
    assert attention_scaling(config.rope) == pytest.approx(scale, rel=1e-12)


def test_eos_ids_come_from_generation_config_then_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA, eos_token_id=2)))
    assert eos_token_ids(tmp_path) == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128009]}))
    assert eos_token_ids(tmp_path) == (128001, 128009)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": None}))
    assert eos_token_ids(tmp_path) == (2,)
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA)))
    assert eos_token_ids(tmp_path) == ()
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA, eos_token_id="</s>")))
    with pytest.raises(UnsupportedConfig, match="eos_token_id must be an integer or a list"):
        eos_token_ids(tmp_path)


def _tiny(tmp_path: Path, **config: Any) -> Path:
    spec = TinyCheckpoint("t", "llama", dict(vocab_size=67, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, **config))
    return build(spec, tmp_path / "ckpt")


def _rewrite_config(path: Path, **changes: object) -> None:
    raw = json.loads((path / "config.json").read_text())
    raw.update(changes)
    (path / "config.json").write_text(json.dumps(raw))


def test_weights_that_disagree_with_the_config_are_refused(tmp_path):
    ckpt = _tiny(tmp_path, attention_bias=True)
    ModelSpec(checkpoint=str(ckpt)).config_and_source()  # as written: fine
    _rewrite_config(ckpt, attention_bias=False)  # biases in the file the config would ignore
    with pytest.raises(ValueError, match=r"config does not use, e\.g\. 'model\.layers\.0\.self_attn\."):
        ModelSpec(checkpoint=str(ckpt)).config_and_source()
    _rewrite_config(ckpt, attention_bias=True, mlp_bias=True)  # biases the config wants but the file lacks
    with pytest.raises(ValueError, match=r"lacks 3 tensor\(s\) the config needs, e\.g\. 'model\.layers\.0\.mlp\."):
        ModelSpec(checkpoint=str(ckpt)).config_and_source()
    assert load_hf_config(ckpt).mlp_bias


# config.json as published for two common checkpoints (Llama 3.2 1B, Qwen2.5 0.5B Instruct)
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}


def test_common_published_configs_are_read():
    llama = config_from_hf(LLAMA_3_2_1B)
    assert llama.rope == RopeConfig("llama3", 500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=8192)
    assert (llama.head_dim, llama.num_kv_heads, llama.tie_word_embeddings) == (64, 8, True)
    qwen = config_from_hf(QWEN2_5_0_5B)
    assert qwen.qkv_bias and qwen.sliding_windows == () and qwen.rope.theta == 1e6 and qwen.head_dim == 64
    # Qwen2.5's long-context recipe: add yarn to the same config
    long = config_from_hf(dict(QWEN2_5_0_5B, rope_scaling={"factor": 4.0, "original_max_position_embeddings": 32768,
                                                          "type": "yarn"}))
    assert long.rope.rope_type == "yarn" and long.rope.factor == 4.0


def test_docs_list_every_decided_key():
    text = (ROOT / "docs" / "tp_engine.md").read_text()
    keys = {k for keys in READ_KEYS.values() for k in keys} | set(IRRELEVANT_KEYS) | set(REFUSED_UNLESS)
    assert sorted(k for k in keys if f"`{k}`" not in text) == []


GEMMA_3_270M = {  # google/gemma-3-270m's config.json as transformers 4.x wrote it (the legacy RoPE layout)
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "initializer_range": 0.02,
    "intermediate_size": 2048, "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": 512, "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0", "use_cache": True,
    "use_bidirectional_attention": False, "vocab_size": 262144, "_sliding_window_pattern": 6}


def test_gemma3_in_both_layouts_gives_the_same_config():
    old = config_from_hf(GEMMA_3_270M)
    new = config_from_hf({**{k: v for k, v in GEMMA_3_270M.items()
                             if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")},
                          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})
    assert old == new
    assert old.rope.theta == 1e6 and old.sliding_rope == RopeConfig("default", 10000.0)
    assert old.sliding_windows == ((512,) * 5 + (None,)) * 3 and old.tie_word_embeddings
    assert old.qk_norm and old.sandwich_norms and old.norm_offset and old.activation == "gelu_tanh"
    assert old.attention_scale == 256 ** -0.5 and old.embedding_scale == pytest.approx(640 ** 0.5, rel=1e-7)
    # without layer_types, every 6th layer is global, as Gemma3TextConfig derives it
    derived = config_from_hf({k: v for k, v in GEMMA_3_270M.items() if k != "layer_types"})
    assert derived.sliding_windows == old.sliding_windows


@pytest.mark.parametrize(("change", "message"), [
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"hidden_activation": "gelu"}, "hidden_activation"),
    ({"layer_types": ["sliding_attention"] * 17}, "layer_types"),
    ({"rope_parameters": {"chunked_attention": {"rope_type": "default"}}}, "chunked_attention"),
    ({"model_type": "gemma3"}, "model_type"),
])
def test_gemma3_math_it_lacks_is_refused_by_name(change, message):
    with pytest.raises(UnsupportedConfig, match=message):
        config_from_hf({**GEMMA_3_270M, **change})


def test_metadata_transformers_writes_from_a_gguf_file_is_accepted():
    """What transformers writes for a model it loaded from a GGUF file: names and token ids, not math."""
    metadata = {"_model_name_or_path": "Smollm2 135M 8k Lc100K Mix1 Ep2", "unk_token_id": 0,
                "transformers_version": "5.25.0", "architectures": None}
    assert config_from_hf({**LLAMA, **metadata}) == config_from_hf(LLAMA)
    with pytest.raises(UnsupportedConfig, match="quantization_config"):  # still refused: it changes the weights
        config_from_hf({**LLAMA, **metadata, "quantization_config": {"quant_method": "gguf"}})
