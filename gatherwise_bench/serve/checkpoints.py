"""The random-weight checkpoints `gatherwise bench serve` loads, built here with transformers' own save_pretrained
(no hub): the shape of a small large-vocabulary model, where the logits path matters most, a Llama-shaped
vocab-32000 model with the same body for the other end, and a tiny one for --quick.

Weights are random, so text is nonsense; what matters is the shapes (the LM head's vocab × hidden per rank, the
body's cost per token). The init keeps logits O(1) and makes the layers strong enough that the next token is not
just the input token echoed through the (tied) embeddings, so greedy outputs vary like a real model's.

Such a model's next-token distribution is nearly flat (its top-p nucleus is most of the vocabulary). With
`head_entropy` the builder scales the logits so that the model's mean next-token entropy at T = 1 is near the
target instead: logits are linear in the final norm's weight (no LM-head bias in these shapes), so multiplying
that weight by c multiplies every logit by c — tied or untied embeddings alike — and c is solved by bisection
on the entropy measured with the model's own forward over ENTROPY_PROMPTS random token-id prompts of
ENTROPY_PROMPT_LEN tokens (the mean over every position). Random prompts stand in for text: the figure is the
model's entropy on its serving bench's kind of input (random ids), stated as such.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatherwise.bench.serve.tokenizer import write_tokenizer

BUILT_MARKER = ".gatherwise-built"  # written last: a directory without it is an interrupted build
ENTROPY_PROMPTS = 4
ENTROPY_PROMPT_LEN = 32


@dataclass(frozen=True)
class ModelShape:
    name: str
    model_type: str  # llama | qwen2
    config: dict[str, Any]  # keyword arguments of LlamaConfig / Qwen2Config
    about: str

    @property
    def vocab(self) -> int:
        return int(self.config["vocab_size"])


_QWEN05_BODY = dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864)
# Qwen2.5-0.5B has 24 layers; 4 keep a CPU run affordable, which makes the body cheaper next to the LM head
# (the head of 151936 x 896 costs ~9 such layers per token), so the logits path's share is larger than in the
# real model. The docs say so next to every number.
SERVE_LAYERS = 4
MODEL_SHAPES = {shape.name: shape for shape in (
    ModelShape("qwen2.5-0.5b-shape", "qwen2",
               dict(_QWEN05_BODY, num_hidden_layers=SERVE_LAYERS, vocab_size=151936, tie_word_embeddings=True,
                    max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                    bos_token_id=1, eos_token_id=2),
               f"Qwen2.5-0.5B's shape (hidden 896, 14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied "
               f"embeddings), {SERVE_LAYERS} layers instead of 24"),
    ModelShape("llama-32k", "llama",
               dict(_QWEN05_BODY, num_hidden_layers=SERVE_LAYERS, vocab_size=32000, tie_word_embeddings=False,
                    max_position_embeddings=4096, bos_token_id=1, eos_token_id=2),
               f"Llama, the same body (hidden 896, 14 heads, 2 KV heads, intermediate 4864), vocab 32000, untied, "
               f"{SERVE_LAYERS} layers"),
    ModelShape("tiny", "llama",
               dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
                    num_hidden_layers=2, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=512,
                    bos_token_id=1, eos_token_id=2),
               "tiny Llama (hidden 128, 4 heads, 2 KV heads, 2 layers, vocab 32000): --quick, function only"),
)}


def initialise_random(model: Any, seed: int, noise_dtype: Any = None) -> None:
    """Random weights at scales that keep logits O(1), every bias non-zero, and the layers strong enough that the
    residual does not just echo the input token through tied embeddings. `noise_dtype`: the dtype the noise is
    drawn in (float32 by default; the test checkpoints draw float64)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=noise_dtype or torch.float32)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith(".bias"):
                value = 0.3 * noise
            elif name.endswith("embed_tokens.weight"):
                value = 0.1 * noise
            elif name.endswith(("o_proj.weight", "down_proj.weight")):  # strong enough not to echo the input
                value = 2.0 * noise / math.sqrt(param.shape[1])
            else:  # [out, in]: unit-variance outputs
                value = noise / math.sqrt(param.shape[1])
            param.copy_(value)


def mean_entropy(logits: Any) -> float:
    """Mean entropy in nats of softmax over the last dim, float64."""
    import torch

    logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    return float(-(logp.exp() * logp).sum(dim=-1).mean())


def scale_to_entropy(model: Any, vocab: int, target: float, seed: int) -> tuple[float, float, float]:
    """Scale the final norm's weight so the model's mean next-token entropy is `target` (nats, T = 1), measured
    on random token-id prompts. Returns (scale, entropy before, entropy after)."""
    import torch

    if not 0.0 < target < math.log(vocab):
        raise ValueError(f"head entropy must be in (0, ln {vocab} = {math.log(vocab):.2f}) nats, got {target}")
    gen = torch.Generator().manual_seed(seed + 1)
    prompts = torch.randint(0, vocab, (ENTROPY_PROMPTS, ENTROPY_PROMPT_LEN), generator=gen)
    with torch.no_grad():
        base = model(input_ids=prompts).logits.to(torch.float64)
        before = mean_entropy(base)
        lo, hi = 0.0, 1.0
        while mean_entropy(hi * base) > target:  # entropy falls as the logits grow
            hi *= 2.0
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if mean_entropy(mid * base) > target else (lo, mid)
        scale = (lo + hi) / 2
        model.model.norm.weight.mul_(scale)
        after = mean_entropy(model(input_ids=prompts).logits)
    return scale, before, after


def build_checkpoint(shape: ModelShape, directory: Path, seed: int = 0, head_entropy: float | None = None) -> Path:
    """config.json, float32 safetensors and the tokenizer of `shape` in `directory` (reused when already built).
    `head_entropy`: scale the logits to this mean next-token entropy (nats, see the module docstring); None keeps
    the random init's."""
    if (directory / BUILT_MARKER).is_file():
        return directory
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                             "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[shape.model_type]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**shape.config))
    initialise_random(model, seed)
    marker: dict[str, Any] = {"shape": shape.name, "seed": seed, "about": shape.about}
    if head_entropy is not None:
        scale, before, after = scale_to_entropy(model, shape.vocab, head_entropy, seed)
        marker["head_entropy"] = {"target": head_entropy, "logit_scale": scale, "entropy_before": before,
                                  "entropy_after": after, "measured_on": f"{ENTROPY_PROMPTS} random token-id prompts "
                                  f"of {ENTROPY_PROMPT_LEN}, every position"}
    directory.mkdir(parents=True, exist_ok=True)
    model.to(torch.float32).save_pretrained(directory)
    write_tokenizer(directory, shape.vocab)
    (directory / BUILT_MARKER).write_text(json.dumps(marker))
    return directory
