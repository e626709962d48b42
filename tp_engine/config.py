"""Model shape: the tiny random default, or what an HF Llama/Qwen2 `config.json` says."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from engine_hooks.handshake import stable_hash

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 32000
    hidden_size: int = 128
    intermediate_size: int = 344
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False  # Qwen2 has q/k/v biases, Llama does not
    tie_word_embeddings: bool = False
    model_type: str = "llama"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    def stable_hash(self) -> int:
        return stable_hash(json.dumps(dataclasses.asdict(self), sort_keys=True))


def tiny_config(vocab_size: int = 32000) -> ModelConfig:
    """The seeded random default: small enough for 2 CPU cores, real enough to exercise every layer."""
    return ModelConfig(vocab_size=vocab_size)


def config_from_hf(raw: dict) -> ModelConfig:
    """Read an HF `config.json` dict of a Llama or Qwen2 model."""
    model_type = raw.get("model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}: expected one of {', '.join(SUPPORTED_MODEL_TYPES)}")
    if raw.get("rope_scaling"):
        raise ValueError(f"rope_scaling {raw['rope_scaling']!r} is not supported by tp_engine")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {raw['hidden_act']!r} is not supported (SwiGLU needs silu)")
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    return ModelConfig(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        qkv_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        model_type=model_type,
    )


def load_hf_config(checkpoint_dir: str | Path) -> ModelConfig:
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in checkpoint directory {checkpoint_dir}")
    return config_from_hf(json.loads(path.read_text()))
