"""Weights of one rank: read by HF name from a source (seeded random or safetensors) and sharded on load.

Both sources speak HF Llama/Qwen2/Gemma3 names (`model.layers.N.self_attn.q_proj.weight`, ...) and hand out
slices, so a checkpoint rank reads only its own rows/columns and the random model shards exactly like one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from gatherwise.stable_hash import stable_hash
from gatherwise.tp_engine.config import ModelConfig
from gatherwise.tp_engine.layers import Span, head_shard, split_evenly, vocab_span

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


def layer_name(layer: int, suffix: str) -> str:
    return f"model.layers.{layer}.{suffix}"


class TensorSource(Protocol):
    def has(self, name: str) -> bool: ...

    def read(self, name: str, dim: int = 0, span: Span | None = None) -> torch.Tensor:
        """Tensor `name`, sliced to `span` along `dim`; rows past the end (dim 0) come back as zeros."""


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    q: torch.Tensor  # [local q heads * head_dim, hidden] (column-parallel)
    k: torch.Tensor  # [local kv heads * head_dim, hidden]
    v: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    o: torch.Tensor  # [hidden, local q heads * head_dim] (row-parallel)
    o_bias: torch.Tensor | None  # [hidden], whole on every rank: added once, after the all_reduce
    post_norm: torch.Tensor
    gate: torch.Tensor  # [local intermediate, hidden] (column-parallel)
    up: torch.Tensor
    down: torch.Tensor  # [hidden, local intermediate] (row-parallel)
    gate_bias: torch.Tensor | None
    up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None  # [hidden], whole on every rank
    q_norm: torch.Tensor | None = None  # [head_dim], shared by every head (qk_norm)
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None  # [hidden] (sandwich_norms)
    mlp_out_norm: torch.Tensor | None = None


@dataclass
class RankWeights:
    embed: torch.Tensor  # [shard width, hidden]: vocab rows of this rank, zero padded
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # [shard width, hidden]: zero rows past the vocab


# Each projection of a layer: LayerWeights field -> (its name inside the layer, its Megatron split, the config flag
# that gives it a bias). A split is (dim, part): dim 0 splits the output rows (column-parallel), dim 1 the input
# columns (row-parallel), over this rank's part of the q heads, the kv heads or the MLP. A column-parallel bias is
# split like the rows; a row-parallel one is whole on every rank (added once, after the all_reduce).
_PROJECTIONS: dict[str, tuple[str, tuple[int, str], str]] = {
    "q": ("self_attn.q_proj", (0, "q"), "qkv_bias"),
    "k": ("self_attn.k_proj", (0, "kv"), "qkv_bias"),
    "v": ("self_attn.v_proj", (0, "kv"), "qkv_bias"),
    "o": ("self_attn.o_proj", (1, "q"), "o_bias"),
    "gate": ("mlp.gate_proj", (0, "mlp"), "mlp_bias"),
    "up": ("mlp.up_proj", (0, "mlp"), "mlp_bias"),
    "down": ("mlp.down_proj", (1, "mlp"), "mlp_bias"),
}
_NORMS = {"input_norm": "input_layernorm.weight", "post_norm": "post_attention_layernorm.weight"}  # whole
# Gemma3 normalizes the attention and MLP outputs too: its post_attention_layernorm is the attention output's,
# and the MLP's input norm is pre_feedforward_layernorm.
_SANDWICH_NORMS = {"input_norm": "input_layernorm.weight", "post_norm": "pre_feedforward_layernorm.weight",
                   "attn_out_norm": "post_attention_layernorm.weight",
                   "mlp_out_norm": "post_feedforward_layernorm.weight"}
_QK_NORMS = {"q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}


def layer_norm_names(config: ModelConfig) -> dict[str, str]:
    """LayerWeights field -> the name of that norm's weight inside a layer."""
    return {**(_SANDWICH_NORMS if config.sandwich_norms else _NORMS), **(_QK_NORMS if config.qk_norm else {})}


def shard_weights(source: TensorSource, config: ModelConfig, rank: int, world_size: int,
                  dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> RankWeights:
    """This rank's slices of every tensor, converted to the compute dtype."""

    def read(name: str, dim: int = 0, span: Span | None = None) -> torch.Tensor:
        return source.read(name, dim, span).to(device=device, dtype=dtype).contiguous()

    def read_norm(name: str) -> torch.Tensor:
        return read(name) + 1 if config.norm_offset else read(name)  # Gemma scales by (1 + weight)

    vocab = vocab_span(config.vocab_size, rank, world_size)
    heads = head_shard(config, rank, world_size)
    hd = config.head_dim
    parts = {"q": Span(heads.q.start * hd, heads.q.stop * hd), "kv": Span(heads.kv.start * hd, heads.kv.stop * hd),
             "mlp": split_evenly(config.intermediate_size, world_size, rank)}
    layers = []
    for i in range(config.num_layers):
        # the norms and projections are tensors; a bias is None where the config has none
        tensors: dict[str, Any] = {f: read_norm(layer_name(i, n)) for f, n in layer_norm_names(config).items()}
        for field, (prefix, (dim, part), bias_flag) in _PROJECTIONS.items():
            tensors[field] = read(layer_name(i, f"{prefix}.weight"), dim, parts[part])
            bias_rows = parts[part] if dim == 0 else None
            tensors[f"{field}_bias"] = (read(layer_name(i, f"{prefix}.bias"), 0, bias_rows)
                                        if getattr(config, bias_flag) else None)
        layers.append(LayerWeights(**tensors))
    head_name = LM_HEAD if source.has(LM_HEAD) and not config.tie_word_embeddings else EMBED
    return RankWeights(embed=read(EMBED, 0, vocab), layers=layers, final_norm=read_norm(FINAL_NORM),
                       lm_head=read(head_name, 0, vocab))


def check_tensor_names(names: Iterable[str], config: ModelConfig) -> None:
    """Refuse a checkpoint whose tensors are not exactly those the config implies: a tensor the model would not
    read (a bias the config does not switch on, an extra layer, ...) means config and weights disagree."""
    expected = set(random_shapes(config))
    names = set(names)
    ignorable = {n for n in names if n.endswith(".rotary_emb.inv_freq")}  # a recomputed buffer older exports saved
    if config.tie_word_embeddings:
        ignorable.add(LM_HEAD)  # transformers ties the head to the embedding and ignores a stored copy too
    missing = sorted(expected - names - ({LM_HEAD} if config.tie_word_embeddings else set()))
    unused = sorted(names - expected - ignorable)
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensor(s) the config needs, e.g. {missing[0]!r}")
    if unused:
        raise ValueError(f"checkpoint has {len(unused)} tensor(s) its config does not use, e.g. {unused[0]!r}: "
                         f"config.json and the weights disagree")


def _slice(t: torch.Tensor, dim: int, span: Span | None) -> torch.Tensor:
    if span is None:
        return t
    stop = min(span.stop, t.shape[dim])
    part = t.narrow(dim, min(span.start, stop), max(0, stop - span.start))
    if part.shape[dim] == span.size:
        return part
    if dim != 0:
        raise ValueError(f"slice {span} runs past dimension {dim} of size {t.shape[dim]}")
    pad = torch.zeros((span.size - part.shape[0], *t.shape[1:]), dtype=t.dtype)
    return torch.cat([part, pad])


# -- seeded random weights -------------------------------------------------------------------------------
def random_shapes(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], float, float]]:
    """HF name -> (shape, mean, std) of the random model. Scales keep activations and logits O(1)."""
    h, q_out, kv_out = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    inter = config.intermediate_size
    norm_mean = 0.0 if config.norm_offset else 1.0  # stored as (scale - 1) when the model adds the 1
    spec: dict[str, tuple[tuple[int, ...], float, float]] = {
        EMBED: ((config.vocab_size, h), 0.0, 1.0),
        FINAL_NORM: ((h,), norm_mean, 0.1),
        LM_HEAD: ((config.vocab_size, h), 0.0, 2.0 / math.sqrt(h)),
    }
    for i in range(config.num_layers):
        layer: dict[str, tuple[tuple[int, ...], float, float]] = {
            name: ((config.head_dim if field in _QK_NORMS else h,), norm_mean, 0.1)
            for field, name in layer_norm_names(config).items()}
        layer.update({
            "self_attn.q_proj.weight": ((q_out, h), 0.0, 2.0 / math.sqrt(h)),
            "self_attn.k_proj.weight": ((kv_out, h), 0.0, 2.0 / math.sqrt(h)),
            "self_attn.v_proj.weight": ((kv_out, h), 0.0, 1.0 / math.sqrt(h)),
            "self_attn.o_proj.weight": ((h, q_out), 0.0, 1.0 / math.sqrt(q_out)),
            "mlp.gate_proj.weight": ((inter, h), 0.0, 1.0 / math.sqrt(h)),
            "mlp.up_proj.weight": ((inter, h), 0.0, 1.0 / math.sqrt(h)),
            "mlp.down_proj.weight": ((h, inter), 0.0, 1.0 / math.sqrt(inter)),
        })
        if config.qkv_bias:
            layer.update({f"self_attn.{p}_proj.bias": ((n,), 0.0, 0.1) for p, n in
                          (("q", q_out), ("k", kv_out), ("v", kv_out))})
        if config.o_bias:
            layer["self_attn.o_proj.bias"] = ((h,), 0.0, 0.1)
        if config.mlp_bias:
            layer.update({f"mlp.{p}_proj.bias": ((n,), 0.0, 0.1) for p, n in (("gate", inter), ("up", inter),
                                                                            ("down", h))})
        spec.update({layer_name(i, k): v for k, v in layer.items()})
    return spec


_SEED_STRIDE = 1_000_003  # a prime: (seed, tensor name) pairs map to distinct generator seeds
_SEED_LIMIT = 1 << 63  # torch.Generator.manual_seed takes a non-negative int64


class RandomSource:
    """Seeded random weights: every tensor is a pure function of (seed, name), identical on every rank."""

    def __init__(self, config: ModelConfig, seed: int = 0) -> None:
        self.seed = seed
        self._spec = random_shapes(config)
        if config.tie_word_embeddings:
            del self._spec[LM_HEAD]

    def has(self, name: str) -> bool:
        return name in self._spec

    def full(self, name: str) -> torch.Tensor:
        shape, mean, std = self._spec[name]
        gen = torch.Generator().manual_seed((self.seed * _SEED_STRIDE + stable_hash(name)) % _SEED_LIMIT)
        return torch.randn(shape, generator=gen, dtype=torch.float64) * std + mean

    def read(self, name: str, dim: int = 0, span: Span | None = None) -> torch.Tensor:
        return _slice(self.full(name), dim, span)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: self.full(name) for name in self._spec}


# -- HF safetensors checkpoints --------------------------------------------------------------------------
class SafetensorsSource:
    """Tensors of every `*.safetensors` file in a checkpoint directory, read slice by slice."""

    def __init__(self, checkpoint_dir: str | Path) -> None:
        from safetensors import safe_open

        files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in checkpoint directory {checkpoint_dir}")
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where = {name: h for h in self._handles for name in h.keys()}  # noqa: SIM118 - a safe_open handle, not a dict

    def has(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def read(self, name: str, dim: int = 0, span: Span | None = None) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"checkpoint has no tensor {name!r}")
        sl = self._where[name].get_slice(name)
        shape = sl.get_shape()
        if span is None:
            return sl[:]
        stop = min(span.stop, shape[dim])
        start = min(span.start, stop)
        part = sl[start:stop] if dim == 0 else sl[:, start:stop]
        return _slice(part, dim, Span(0, span.size)) if part.shape[dim] < span.size else part
