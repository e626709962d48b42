"""Model shape and math: the tiny random default, or what an HF Llama/Qwen2/Gemma3 `config.json` says (`hf_config`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from gatherwise.stable_hash import stable_hash
from gatherwise.tp_engine.rope import RopeConfig

ACTIVATIONS = ("silu", "gelu_tanh")


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
    # Gemma3: the math its blocks add to the Llama decoder
    sliding_rope: RopeConfig | None = None  # RoPE of the sliding-window layers when it differs from `rope`
    qk_norm: bool = False  # RMSNorm over each query and key head before RoPE
    sandwich_norms: bool = False  # RMSNorm on the attention and MLP outputs before each residual add
    norm_offset: bool = False  # norms scale by (1 + weight): added to the weight when it is read
    embedding_scale: float = 1.0  # the embedding is multiplied by it (Gemma: sqrt(hidden), rounded as stored)
    activation: str = "silu"  # of the gated MLP: silu (SwiGLU) or gelu_tanh (GeGLU)
    attention_scale: float | None = None  # on q·k; None = head_dim ** -0.5

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
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    def sliding_window(self, layer: int) -> int | None:
        """How many most recent positions layer `layer` attends to; None = all (full causal attention)."""
        return self.sliding_windows[layer] if self.sliding_windows else None

    def layer_rope(self, layer: int) -> RopeConfig:
        """The RoPE of layer `layer`: `sliding_rope` on sliding-window layers when the model has one."""
        if self.sliding_rope is not None and self.sliding_window(layer) is not None:
            return self.sliding_rope
        return self.rope

    def stable_hash(self) -> int:
        return stable_hash(json.dumps(dataclasses.asdict(self), sort_keys=True))


def tiny_config(vocab_size: int = 32000) -> ModelConfig:
    """The seeded random default: small enough for 2 CPU cores, real enough to exercise every layer."""
    return ModelConfig(vocab_size=vocab_size)
