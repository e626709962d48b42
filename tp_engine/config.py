"""Model shape and math: the tiny random default, or what an HF Llama/Qwen2 `config.json` says (`hf_config`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from gatherwise.stable_hash import stable_hash
from gatherwise.tp_engine.rope import RopeConfig


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 32000
    hidden_size: int = 128
    intermediate_size: int = 344
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope: RopeConfig = RopeConfig()
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False  # q/k/v projections: Qwen2 always, Llama with attention_bias
    o_bias: bool = False  # output projection: Llama with attention_bias
    mlp_bias: bool = False  # gate/up/down: Llama with mlp_bias
    tie_word_embeddings: bool = False
    # per layer: attend to the last N positions only (Qwen2 sliding-window layers); empty or None = full causal
    sliding_windows: tuple[int | None, ...] = ()
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
        if self.sliding_windows and len(self.sliding_windows) != self.num_layers:
            raise ValueError(f"sliding_windows has {len(self.sliding_windows)} entries for {self.num_layers} layers")
        if any(w is not None and w < 1 for w in self.sliding_windows):
            raise ValueError(f"sliding windows must be >= 1, got {self.sliding_windows}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    def sliding_window(self, layer: int) -> int | None:
        """How many most recent positions layer `layer` attends to; None = all (full causal attention)."""
        return self.sliding_windows[layer] if self.sliding_windows else None

    def stable_hash(self) -> int:
        return stable_hash(json.dumps(dataclasses.asdict(self), sort_keys=True))


def tiny_config(vocab_size: int = 32000) -> ModelConfig:
    """The seeded random default: small enough for 2 CPU cores, real enough to exercise every layer."""
    return ModelConfig(vocab_size=vocab_size)
