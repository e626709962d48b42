"""Read an HF Llama/Qwen2/Gemma3 checkpoint's `config.json` (and `generation_config.json`): right or refused.

Every key is decided: read into the `ModelConfig`, known to change nothing the model computes, or refused
with an error naming it. A key this module does not know is refused too: it cannot tell whether the key
changes the math, and a silently wrong model is worse than none. Both config layouts are read: the older one
(top-level `rope_theta`, `rope_scaling`) and transformers >= 5's `rope_parameters`.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from gatherwise.tp_engine.config import ModelConfig
from gatherwise.tp_engine.rope import ROPE_TYPES, RopeConfig

MODEL_TYPES = ("llama", "qwen2", "gemma3_text")

# Read into the ModelConfig (or, eos_token_id, into the stop tokens), per model type.
_READ_COMMON = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "tie_word_embeddings", "rope_theta",
    "rope_scaling", "rope_parameters", "max_position_embeddings", "eos_token_id",
)
READ_KEYS = {
    "llama": (*_READ_COMMON, "attention_bias", "mlp_bias"),
    "qwen2": (*_READ_COMMON, "use_sliding_window", "sliding_window", "max_window_layers", "layer_types"),
    "gemma3_text": (*_READ_COMMON, "attention_bias", "hidden_activation", "query_pre_attn_scalar", "sliding_window",
                    "layer_types", "sliding_window_pattern", "_sliding_window_pattern", "rope_local_base_freq",
                    "attn_logit_softcapping", "final_logit_softcapping", "use_bidirectional_attention"),
}

# Known not to change any number the model computes, whatever their value: why, per key.
IRRELEVANT_KEYS: dict[str, str] = {
    **dict.fromkeys(("transformers_version", "architectures", "_name_or_path", "_model_name_or_path", "_commit_hash",
                     "finetuning_task", "tokenizer_class", "prefix", "task_specific_params", "is_llama_config",
                     "is_decoder", "model_name"),
                    "metadata"),
    **dict.fromkeys(("dtype", "torch_dtype", "use_bfloat16"),
                    "storage dtype: tensors are read as stored and computed in the engine's compute dtype"),
    **dict.fromkeys(("initializer_range", "attention_dropout", "use_cache", "problem_type", "id2label", "label2id",
                     "num_labels"), "training, caching or classification-head setting; no effect on inference"),
    **dict.fromkeys(("output_hidden_states", "output_attentions", "return_dict", "torchscript", "tf_legacy_loss",
                     "use_return_dict", "_attn_implementation", "_attn_implementation_autoset"),
                    "what a transformers forward returns or which kernel it uses; the math is the same"),
    **dict.fromkeys(("chunk_size_feed_forward", "pretraining_tp"),
                    "splits the same matmuls into pieces; the math is the same"),
    **dict.fromkeys(("bos_token_id", "pad_token_id", "unk_token_id", "sep_token_id", "decoder_start_token_id"),
                    "token ids for the tokenizer and batching; the prompt carries any BOS"),
    **dict.fromkeys(("max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
                     "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
                     "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
                     "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
                     "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
                     "suppress_tokens", "begin_suppress_tokens"),
                    "legacy generation default: decoding is set on the gatherwise command line"),
}

# Refused unless at the harmless value given (the value transformers itself writes by default).
REFUSED_UNLESS: dict[str, tuple[tuple[Any, ...], str]] = {
    "quantization_config": ((None,), "quantized checkpoints are not supported"),
    "auto_map": ((None,), "checkpoints that bring their own modeling code are not supported"),
    "partial_rotary_factor": ((None, 1, 1.0), "partial rotary embeddings are not supported"),
    "is_encoder_decoder": ((None, False), "encoder-decoder models are not supported"),
    "add_cross_attention": ((None, False), "cross-attention is not supported"),
    "tie_encoder_decoder": ((None, False), "encoder-decoder models are not supported"),
    "cross_attention_hidden_size": ((None,), "cross-attention is not supported"),
    "pruned_heads": ((None, {}), "pruned attention heads are not supported"),
    "rope_interleaved": ((None, False), "interleaved RoPE is not supported"),  # nanotron exports write false
}

_ROPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"},
}
_ROPE_REQUIRED = {"linear": {"factor"}, "llama3": {"factor", "low_freq_factor", "high_freq_factor"},
                  "yarn": {"factor"}}
_QWEN2_MAX_WINDOW_LAYERS = 28  # Qwen2Config's default


class UnsupportedConfig(ValueError):
    """A config.json key (or value) tp_engine does not support; the message names the key."""


def config_from_hf(raw: dict) -> ModelConfig:
    """Read an HF `config.json` dict of a Llama or Qwen2 model, or raise UnsupportedConfig naming the key."""
    model_type = raw.get("model_type")
    if model_type not in MODEL_TYPES:
        raise UnsupportedConfig(f"model_type {model_type!r} is not supported: expected one of "
                                f"{', '.join(MODEL_TYPES)}")
    _check_every_key(raw, model_type)
    if model_type == "gemma3_text":
        return _gemma3(raw)
    hidden_act = raw.get("hidden_act", "silu")
    if hidden_act not in ("silu", "swish"):
        raise UnsupportedConfig(f"hidden_act {hidden_act!r} is not supported (SwiGLU needs silu)")
    return ModelConfig(**_decoder_fields(raw, model_type),
                       sliding_windows=_sliding_windows(raw, _int(raw, "num_hidden_layers")) if model_type == "qwen2"
                       else ())


def _decoder_fields(raw: dict, model_type: str) -> dict[str, Any]:
    """What every supported decoder reads alike: shapes, RoPE, norm epsilon, biases, the tied head."""
    heads = _int(raw, "num_attention_heads")
    hidden = _int(raw, "hidden_size")
    layers = _int(raw, "num_hidden_layers")
    kv_heads = _int(raw, "num_key_value_heads") if raw.get("num_key_value_heads") is not None else heads
    head_dim = _int(raw, "head_dim") if raw.get("head_dim") is not None else hidden // heads
    attention_bias = _bool(raw, "attention_bias")
    return dict(
        vocab_size=_int(raw, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_int(raw, "intermediate_size"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_float(raw, "rms_norm_eps", 1e-6),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias,
        mlp_bias=_bool(raw, "mlp_bias"),
        model_type=model_type,
        rope=read_rope(raw) if model_type != "gemma3_text" else read_rope(raw, default_theta=_GEMMA3_ROPE_THETA),
        tie_word_embeddings=_bool(raw, "tie_word_embeddings", default=model_type == "gemma3_text"),
    )


_GEMMA3_ROPE_THETA, _GEMMA3_LOCAL_THETA, _GEMMA3_WINDOW_PATTERN = 1_000_000.0, 10_000.0, 6  # Gemma3TextConfig's
_LAYER_TYPES = ("full_attention", "sliding_attention")


def _gemma3(raw: dict) -> ModelConfig:
    """Gemma3's text decoder: the Llama fields plus its own blocks, each read or refused."""
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if raw.get(key) is not None:
            raise UnsupportedConfig(f"config key {key!r} = {raw[key]!r}: logit soft-capping is not supported")
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedConfig("config key 'use_bidirectional_attention' = true: only causal attention is supported")
    act = raw.get("hidden_activation", raw.get("hidden_act", "gelu_pytorch_tanh"))
    if act != "gelu_pytorch_tanh":
        raise UnsupportedConfig(f"hidden_activation {act!r} is not supported (Gemma3's GeGLU needs "
                                f"gelu_pytorch_tanh)")
    params = raw.get("rope_parameters")
    per_type = isinstance(params, dict) and bool(params) and all(isinstance(v, dict) for v in params.values())
    fields = _decoder_fields({k: v for k, v in raw.items() if not (per_type and k == "rope_parameters")},
                             "gemma3_text")
    layers = fields["num_layers"]
    if per_type:
        assert isinstance(params, dict)
        unknown = set(params) - set(_LAYER_TYPES)
        if unknown:
            raise UnsupportedConfig(f"config key 'rope_parameters' has layer type {sorted(unknown)[0]!r}: expected "
                                    f"{' or '.join(_LAYER_TYPES)}")
        ropes = {t: read_rope({"rope_parameters": params[t], "max_position_embeddings":
                              raw.get("max_position_embeddings")}, default_theta=_GEMMA3_ROPE_THETA)
                 for t in params}
        fields["rope"] = ropes.get("full_attention", fields["rope"])
        local = ropes.get("sliding_attention")
    else:
        local = RopeConfig(theta=_float(raw, "rope_local_base_freq", _GEMMA3_LOCAL_THETA))
    scalar = _float(raw, "query_pre_attn_scalar", 256)
    if scalar <= 0:
        raise UnsupportedConfig(f"config key 'query_pre_attn_scalar' must be > 0, got {scalar}")
    return ModelConfig(
        **fields,
        sliding_windows=_gemma3_windows(raw, layers),
        sliding_rope=local,
        qk_norm=True,
        sandwich_norms=True,
        norm_offset=True,
        embedding_scale=_float32(math.sqrt(fields["hidden_size"])),
        activation="gelu_tanh",
        attention_scale=scalar ** -0.5,
    )


def _gemma3_windows(raw: dict, layers: int) -> tuple[int | None, ...]:
    layer_types = raw.get("layer_types")
    if layer_types is None:  # Gemma3TextConfig: every pattern-th layer is global, the rest slide
        pattern = raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", _GEMMA3_WINDOW_PATTERN))
        if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 1:
            raise UnsupportedConfig(f"config key 'sliding_window_pattern' must be an integer >= 1, got {pattern!r}")
        layer_types = [_LAYER_TYPES[bool((i + 1) % pattern)] for i in range(layers)]
    if not isinstance(layer_types, list) or len(layer_types) != layers or \
            any(t not in _LAYER_TYPES for t in layer_types):
        raise UnsupportedConfig(f"config key 'layer_types' must list full_attention or sliding_attention for each of "
                                f"the {layers} layers, got {layer_types!r}")
    window = raw.get("sliding_window")
    if "sliding_attention" in layer_types and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise UnsupportedConfig(f"config key 'sliding_window' must be an integer >= 1, got {window!r}")
    return tuple(window if t == "sliding_attention" else None for t in layer_types)


def _float32(value: float) -> float:
    """`value` rounded to float32: transformers holds Gemma's embedding scale sqrt(hidden) as a float32 buffer, and
    the engine computes in float32 or wider, so that rounding is part of the model's math."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _check_every_key(raw: dict, model_type: str) -> None:
    for key, value in raw.items():
        if key in READ_KEYS[model_type] or key in IRRELEVANT_KEYS:
            continue
        if key in REFUSED_UNLESS:
            harmless, why = REFUSED_UNLESS[key]
            if value not in harmless:
                raise UnsupportedConfig(f"config key {key!r} = {value!r}: {why}")
            continue
        known = [t for t, keys in READ_KEYS.items() if key in keys]
        hint = f" (it belongs to model_type {known[0]!r})" if known else ""
        raise UnsupportedConfig(f"config key {key!r} is not known to tp_engine for model_type {model_type!r}{hint}; "
                                f"refusing rather than risk ignoring something that changes the math")


def read_rope(raw: dict, default_theta: float = 10000.0) -> RopeConfig:
    """RoPE from either layout: `rope_parameters` (transformers >= 5) or top-level `rope_theta` + `rope_scaling`."""
    params, scaling = raw.get("rope_parameters"), raw.get("rope_scaling")
    if params is not None and scaling is not None and params != scaling:
        raise UnsupportedConfig(f"config keys 'rope_parameters' {params!r} and 'rope_scaling' {scaling!r} disagree")
    where = "rope_parameters" if params is not None else "rope_scaling"
    given = params if params is not None else scaling
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise UnsupportedConfig(f"config key {where!r} must be an object, got {given!r}")
    rope = dict(given)
    if rope and all(isinstance(v, dict) for v in rope.values()):
        raise UnsupportedConfig(f"config key {where!r}: RoPE per layer type ({', '.join(rope)}) is not supported")
    rope_type, legacy_type = rope.pop("rope_type", None), rope.pop("type", None)
    if rope_type is not None and legacy_type is not None and rope_type != legacy_type:
        raise UnsupportedConfig(f"config key '{where}.rope_type' {rope_type!r} and '{where}.type' {legacy_type!r} "
                                f"disagree")
    rope_type = rope_type or legacy_type or "default"
    if rope_type not in ROPE_TYPES:
        raise UnsupportedConfig(f"config key '{where}.rope_type' = {rope_type!r} is not supported: expected one of "
                                f"{', '.join(ROPE_TYPES)}")
    theta = _rope_theta(raw, rope.pop("rope_theta", None), where, default_theta)
    partial = rope.pop("partial_rotary_factor", None)
    if partial not in (None, 1, 1.0):
        raise UnsupportedConfig(f"config key '{where}.partial_rotary_factor' = {partial!r}: partial rotary "
                                f"embeddings are not supported")
    for key in rope:
        if key not in _ROPE_KEYS[rope_type]:
            raise UnsupportedConfig(f"config key '{where}.{key}' is not a parameter of rope_type {rope_type!r}")
    for key in _ROPE_REQUIRED.get(rope_type, ()):
        if key not in rope:
            raise UnsupportedConfig(f"config key '{where}.{key}' is required by rope_type {rope_type!r}")
    fields: dict[str, Any] = {"rope_type": rope_type, "theta": theta}
    for key in ("low_freq_factor", "high_freq_factor", "attention_factor", "mscale", "mscale_all_dim"):
        if rope.get(key) is not None:
            fields[key] = _float(rope, key, where=where)
    for key in ("beta_fast", "beta_slow"):  # transformers: a missing or zero value means the paper's default
        if rope.get(key):
            fields[key] = _float(rope, key, where=where)
    if "truncate" in rope:
        fields["truncate"] = _bool(rope, "truncate", where=where)
    if rope_type in ("llama3", "yarn"):
        original = rope.get("original_max_position_embeddings")
        if original is None:  # transformers falls back to the model's own context length
            if raw.get("max_position_embeddings") is None:
                raise UnsupportedConfig(f"rope_type {rope_type!r} needs '{where}.original_max_position_embeddings' "
                                        f"or 'max_position_embeddings'")
            original = _int(raw, "max_position_embeddings")
        elif not isinstance(original, int) or isinstance(original, bool):
            raise UnsupportedConfig(f"config key '{where}.original_max_position_embeddings' must be an integer, "
                                    f"got {original!r}")
        fields["original_max_position_embeddings"] = original
    if rope_type != "default":
        factor = rope["factor"]
        if factor is None and rope_type == "yarn":  # transformers derives it from the two context lengths
            factor = _int(raw, "max_position_embeddings") / fields["original_max_position_embeddings"]
        fields["factor"] = _float({"factor": factor}, "factor", where=where)
    try:
        return RopeConfig(**fields)
    except ValueError as exc:
        raise UnsupportedConfig(f"config key {where!r}: {exc}") from None


def _rope_theta(raw: dict, inside: Any, where: str, default: float) -> float:
    top = raw.get("rope_theta")
    if inside is not None and top is not None and float(inside) != float(top):
        raise UnsupportedConfig(f"config keys 'rope_theta' ({top}) and '{where}.rope_theta' ({inside}) disagree")
    value = inside if inside is not None else top
    if value is None:
        return default  # the model type's default in transformers
    return _float({"rope_theta": value}, "rope_theta", where=where if inside is not None else None)


def _sliding_windows(raw: dict, layers: int) -> tuple[int | None, ...]:
    """Qwen2: the window of each layer, as transformers decides it (None = full attention)."""
    use = _bool(raw, "use_sliding_window")
    window = raw.get("sliding_window")
    layer_types = raw.get("layer_types")
    if layer_types is None:
        first = raw.get("max_window_layers", _QWEN2_MAX_WINDOW_LAYERS)
        if not isinstance(first, int) or isinstance(first, bool):
            raise UnsupportedConfig(f"config key 'max_window_layers' must be an integer, got {first!r}")
        sliding = use and window is not None
        layer_types = ["sliding_attention" if sliding and i >= first else "full_attention" for i in range(layers)]
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        raise UnsupportedConfig(f"config key 'layer_types' must list one type per layer ({layers}), got "
                                f"{layer_types!r}")
    for t in layer_types:
        if t not in ("full_attention", "sliding_attention"):
            raise UnsupportedConfig(f"config key 'layer_types' has {t!r}: expected full_attention or "
                                    f"sliding_attention")
    if "sliding_attention" not in layer_types:
        return ()
    if not use:
        raise UnsupportedConfig("config key 'layer_types' has sliding_attention layers but 'use_sliding_window' is "
                                "false: transformers has no window for them")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise UnsupportedConfig(f"config key 'sliding_window' must be an integer >= 1 when use_sliding_window is "
                                f"true, got {window!r}")
    return tuple(window if t == "sliding_attention" else None for t in layer_types)


def _int(raw: dict, key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnsupportedConfig(f"config key {key!r} must be an integer, got {value!r}")
    return value


def _float(raw: dict, key: str, default: float | None = None, where: str | None = None) -> float:
    value = raw.get(key, default)
    name = f"{where}.{key}" if where else key
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise UnsupportedConfig(f"config key {name!r} must be a finite number, got {value!r}")
    return float(value)


def _bool(raw: dict, key: str, where: str | None = None, default: bool = False) -> bool:
    value = raw.get(key, default)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise UnsupportedConfig(f"config key {f'{where}.{key}' if where else key!r} must be true or false, got "
                                f"{value!r}")
    return value


def load_hf_config(checkpoint_dir: str | Path) -> ModelConfig:
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in checkpoint directory {checkpoint_dir}")
    return config_from_hf(json.loads(path.read_text()))


def eos_token_ids(checkpoint_dir: str | Path) -> tuple[int, ...]:
    """The checkpoint's end-of-sequence ids: generation_config.json's `eos_token_id` (what transformers' generate
    stops at), else config.json's; an int or a list; () when neither names one."""
    for name in ("generation_config.json", "config.json"):
        path = Path(checkpoint_dir) / name
        if not path.is_file():
            continue
        value = json.loads(path.read_text()).get("eos_token_id")
        if value is None:
            continue
        ids = [value] if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                for i in ids):
            raise UnsupportedConfig(f"{name}: eos_token_id must be an integer or a list of integers, got {value!r}")
        return tuple(ids)
    return ()
