"""Next-token logits with a trained model's spread, for benchmarks: Zipf-like ranks scaled to a target entropy.

A random-weight checkpoint's next-token distribution is nearly flat (entropy close to ln V, its top-p nucleus
most of the vocabulary); a trained model's is peaked. Any sampler whose speed depends on the nucleus size looks
worse on the first than in use. This generator gives each row the logits x_r = −s · ln(r) of a Zipf law over
the ranks r = 1..V, the ranks laid on the vocab by a random permutation per row (the winners land on any shard),
with the exponent s solved by bisection so that the row's entropy at temperature 1 is the target.

The default target is measured, not assumed: 2.2 nats, the mean next-token entropy at T = 1 of the real rows of
docs/models.md (`python -m gatherwise.bench.real_rows`: SmolLM2-135M-Instruct 1.9-2.0, Gemma-3-270M 2.3-2.8 nats
over its rows sampled at T 0.8 and 1.0). At that entropy a row's top-p 0.95 nucleus is 8 tokens at T 0.8 and 32 at
T 1.0 — the real medians' size (5-8.5 and 13-73) — but every row gets the same one: the real rows' heavy tail (p90
78-666 tokens; 10-50 % of rows overflow a shard's candidates) is not in these logits, so they stand in for the
rows the candidates cover, offline. Where the tail matters (the fallback, the sampler's speed on a model), measure
the model's own rows (`gatherwise bench sampler --logits real:<model>`).
`flat_logits` is the worst case kept beside it: N(0, 1) logits, a nucleus of most of the vocab.
"""

from __future__ import annotations

import math

import torch

DEFAULT_ENTROPY = 2.2  # nats at T = 1: the real rows' mean (see the module docstring)


def zipf_log_weights(vocab: int, exponent: float) -> torch.Tensor:
    """−s · ln(r) for r = 1..V, float64 [V] (rank order: the largest first)."""
    return -exponent * torch.arange(1, vocab + 1, dtype=torch.float64).log()


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of softmax(logits) along the last dim, float64."""
    logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def zipf_exponent(vocab: int, entropy: float, iterations: int = 60) -> float:
    """The Zipf exponent s whose distribution over `vocab` ranks has this entropy (nats). The entropy falls
    monotonically from ln V (s = 0) towards 0 as s grows, so bisection finds it."""
    if not 0.0 < entropy < math.log(vocab):
        raise ValueError(f"entropy must be in (0, ln {vocab} = {math.log(vocab):.3f}) nats, got {entropy}")
    lo, hi = 0.0, 1.0
    while float(entropy_of(zipf_log_weights(vocab, hi))) > entropy:
        hi *= 2.0
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(entropy_of(zipf_log_weights(vocab, mid))) > entropy else (lo, mid)
    return (lo + hi) / 2


def realistic_logits(rows: int, vocab: int, entropy: float = DEFAULT_ENTROPY, seed: int = 0,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[rows, vocab] logits whose every row has `entropy` nats at T = 1, its ranks permuted per row."""
    ranked = zipf_log_weights(vocab, zipf_exponent(vocab, entropy)).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(rows, vocab, dtype=dtype)
    for b in range(rows):
        out[b, torch.randperm(vocab, generator=gen)] = ranked
    return out


def flat_logits(rows: int, vocab: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The worst case: N(0, 1) logits, what a random-weight checkpoint's head gives."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=gen).to(dtype)


def nucleus_sizes(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Tokens each row keeps at this temperature and top-p: the shortest prefix (by probability) reaching p."""
    probs = torch.softmax(logits.to(torch.float64) / temperature, dim=-1).sort(dim=-1, descending=True).values
    cum = probs.cumsum(dim=-1)
    # the mass strictly before each token, as the sampler counts it (kept_count): cum − p would round
    before = torch.cat((torch.zeros_like(cum[..., :1]), cum[..., :-1]), dim=-1)
    return (before < top_p).sum(dim=-1)
