"""Rotary position embedding: the frequency schedules real Llama/Qwen2 checkpoints use, in the HF layout.

Every schedule is a pure function of the config, computed in float64 (transformers computes the same formulas
in float32; the difference is ~1e-7 relative, far below what moves a greedy token). Supported `rope_type`s:
- `default`: inv_freq[i] = theta^(-2i/d);
- `linear`: default / factor (position interpolation);
- `llama3` (Llama 3.1-3.3): long wavelengths divided by factor, short ones kept, a smooth ramp between;
- `yarn`: a per-frequency blend of interpolated and extrapolated frequencies, and cos/sin scaled by an
  attention factor (which scales every attention score by its square).
`dynamic` (NTK) is not here on purpose: transformers rescales it from the longest sequence in the batch, which
a continuous-batching engine cannot reproduce per request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    rope_type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0  # linear, llama3, yarn
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 0  # llama3, yarn
    attention_factor: float | None = None  # yarn; None = derived from factor (and mscale, mscale_all_dim)
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn: round the correction range outward to whole dimensions

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_type!r} is not supported: expected one of {', '.join(ROPE_TYPES)}")
        if self.theta <= 0:
            raise ValueError(f"rope_theta must be > 0, got {self.theta}")
        if self.rope_type != "default" and self.factor <= 0:
            raise ValueError(f"rope factor must be > 0, got {self.factor}")
        if self.rope_type in ("llama3", "yarn") and self.original_max_position_embeddings < 1:
            raise ValueError(f"rope_type {self.rope_type!r} needs original_max_position_embeddings >= 1")
        if self.rope_type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"llama3 rope needs high_freq_factor ({self.high_freq_factor}) > low_freq_factor "
                             f"({self.low_freq_factor})")


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """inv_freq [head_dim / 2], float64."""
    base = rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    inv_freq = 1.0 / base
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3(rope, inv_freq)
    if rope.rope_type == "yarn":
        return _yarn(rope, base, head_dim)
    return inv_freq


def attention_scaling(rope: RopeConfig) -> float:
    """Factor on cos and sin (1 except for yarn)."""
    if rope.rope_type != "yarn":
        return 1.0
    if rope.attention_factor is not None:
        return float(rope.attention_factor)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim)
    return mscale(rope.factor)


def _llama3(rope: RopeConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    old_len = rope.original_max_position_embeddings
    low_wavelen, high_wavelen = old_len / rope.low_freq_factor, old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(rope: RopeConfig, base: torch.Tensor, head_dim: int) -> torch.Tensor:
    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi))
                / (2 * math.log(rope.theta)))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # weight of the unscaled frequency
    return (1.0 / (rope.factor * base)) * (1 - extrapolation) + (1.0 / base) * extrapolation


def rope_tables(positions: torch.Tensor, head_dim: int, rope: RopeConfig,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, head_dim] in the HF Llama layout (the two halves rotate together)."""
    inv_freq = inverse_frequencies(rope, head_dim).to(positions.device)
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    scale = attention_scaling(rope)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
