"""Next-token logits with trained models' spread, for benchmarks: Zipf-like ranks at measured entropies.

A random-weight checkpoint's next-token distribution is nearly flat (entropy close to ln V, its top-p nucleus
most of the vocabulary); a trained model's is peaked, and unevenly so. Any sampler whose speed depends on the
nucleus size looks worse on the first than in use. This generator gives each row the logits x_r = −s · ln(r) of
a Zipf law over the ranks r = 1..V, the ranks laid on the vocab by a random permutation per row (the winners land
on any shard), the exponent s set by the row's entropy at temperature 1.

Each row's entropy is drawn from trained models' own (MEASURED_ENTROPY_PERCENTILES: the 1 536 next-token rows of
docs/models.md, `python -m gatherwise.bench.real_rows`, SmolLM2-135M-Instruct and Gemma-3-270M sampled at T 0.8
and 1.0; mean 2.24 nats, from one-hot rows to 7.2 nats), so a batch mixes near-certain rows with open ones as a
served batch does. Checked against those rows' top-p 0.95 nuclei (each real row against a Zipf row of its own
entropy): at T 0.8 the quantiles agree (SmolLM2 median 6 against 5, p90 58 against 83, p99 252 against 289;
Gemma p90 49 against 78); at T 1.0 the Zipf tail is heavier than a real row's (p90 1 013 against 381 tokens for
SmolLM2, 4 393 against 665 for Gemma), so these rows overstate the T 1.0 fallback. Where the tail matters (the
fallback, the sampler's speed on a model), measure the model's own rows (`gatherwise bench sampler --logits
real:<model>`). A fixed `entropy` gives every row the same one (a calibration knob for checkpoints and tests).
`flat_logits` is the worst case kept beside it: N(0, 1) logits, a nucleus of most of the vocab.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

# Next-token entropy (nats, T = 1) of trained models' rows, its 0th, 5th, ..., 100th percentiles (module docstring).
# The 0th is a one-hot row, 0.0 measured: kept just above it, since no finite Zipf exponent reaches 0.
MEASURED_ENTROPY_PERCENTILES = (0.01, 0.06, 0.21, 0.43, 0.74, 0.96, 1.22, 1.46, 1.70, 1.93, 2.15, 2.39, 2.55, 2.85,
                                3.14, 3.39, 3.71, 4.01, 4.36, 4.74, 7.22)


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


def realistic_logits(rows: int, vocab: int, entropy: float | None = None, seed: int = 0,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[rows, vocab] logits, each row's ranks permuted; every row at `entropy` nats at T = 1, or, by default,
    each at an entropy drawn from trained models' (MEASURED_ENTROPY_PERCENTILES)."""
    gen = torch.Generator().manual_seed(seed)
    if entropy is None:
        exponents = _measured_exponents(vocab)
        # inverse CDF: a uniform draw between two percentiles interpolates the exponent between theirs
        at = torch.rand(rows, generator=gen, dtype=torch.float64) * (len(exponents) - 1)
        low = at.floor().long().clamp(max=len(exponents) - 2)
        knots = torch.tensor(exponents, dtype=torch.float64)
        row_exponents = torch.lerp(knots[low], knots[low + 1], at - low)
    else:
        row_exponents = torch.full((rows,), zipf_exponent(vocab, entropy), dtype=torch.float64)
    unit = zipf_log_weights(vocab, 1.0)
    out = torch.empty(rows, vocab, dtype=dtype)
    for b in range(rows):
        out[b, torch.randperm(vocab, generator=gen)] = (float(row_exponents[b]) * unit).to(dtype)
    return out


@lru_cache(maxsize=8)
def _measured_exponents(vocab: int) -> tuple[float, ...]:
    """The Zipf exponent of each measured percentile over `vocab` ranks (a small vocab cannot hold the highest
    entropies: those are kept just under ln V)."""
    ceiling = 0.99 * math.log(vocab)
    return tuple(zipf_exponent(vocab, min(h, ceiling)) for h in MEASURED_ENTROPY_PERCENTILES)


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
