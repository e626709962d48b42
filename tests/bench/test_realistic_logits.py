"""Benchmark logits and checkpoints with trained models' next-token entropies, not a random head's flat one."""

from __future__ import annotations

import math

import pytest
import torch

from gatherwise.bench.realistic_logits import (
    MEASURED_ENTROPY_PERCENTILES,
    entropy_of,
    flat_logits,
    nucleus_sizes,
    realistic_logits,
    zipf_exponent,
)


@pytest.mark.parametrize("vocab", [1000, 32000, 151936])
@pytest.mark.parametrize("entropy", [1.0, 2.5, 4.0])
def test_every_row_has_the_target_entropy(vocab, entropy):
    x = realistic_logits(3, vocab, entropy, seed=vocab)
    assert x.shape == (3, vocab) and x.dtype == torch.float32
    assert torch.allclose(entropy_of(x), torch.full((3,), entropy, dtype=torch.float64), atol=1e-5)
    assert len({int(i) for i in x.argmax(dim=1)}) > 1  # the winners land on different columns (and shards)


def test_by_default_the_rows_entropies_follow_the_measured_ones():
    x = realistic_logits(200, 8000, seed=1)
    entropies = entropy_of(x)
    measured = torch.tensor(MEASURED_ENTROPY_PERCENTILES, dtype=torch.float64)
    assert float(entropies.min()) >= float(measured[0]) - 1e-6 and float(entropies.max()) <= float(measured[-1]) + 1e-6
    for q, i in ((0.1, 2), (0.5, 10), (0.9, 18)):  # the draw's deciles sit near the measured ones
        assert abs(float(torch.quantile(entropies, q)) - float(measured[i])) < 0.35
    assert torch.equal(realistic_logits(3, 8000, seed=1), realistic_logits(3, 8000, seed=1))  # seeded


def test_a_vocab_too_small_for_the_highest_measured_entropies_keeps_them_under_ln_v():
    entropies = entropy_of(realistic_logits(200, 500, seed=0))
    assert float(entropies.max()) < math.log(500)


def test_the_exponent_is_monotone_and_bad_targets_are_refused():
    assert zipf_exponent(32000, 1.5) > zipf_exponent(32000, 2.5) > zipf_exponent(32000, 3.5) > 0
    for bad in (0.0, -1.0, math.log(32000), 20.0):
        with pytest.raises(ValueError, match="entropy must be in"):
            zipf_exponent(32000, bad)


def test_realistic_nuclei_are_small_and_flat_ones_most_of_the_vocab():
    vocab = 151936
    peaked = nucleus_sizes(realistic_logits(2, vocab, 2.5), 0.8, 0.95)
    flat = nucleus_sizes(flat_logits(2, vocab), 0.8, 0.95)
    assert bool((peaked < 64).all()) and bool((flat > vocab // 2).all())
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)
    # thresholds off the sums: softmax of the logs rounds 0.3 to 0.29999999999999993, so 0.5 + 0.3 is just below 0.8
    assert nucleus_sizes(probs.log(), 1.0, 0.79).tolist() == [2]  # 0.5 + 0.3 passes 0.79
    assert nucleus_sizes(probs.log(), 1.0, 0.81).tolist() == [3]


@pytest.mark.timeout(120)
def test_a_built_checkpoint_is_scaled_to_the_target_entropy():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from gatherwise.bench.serve.checkpoints import MODEL_SHAPES, initialise_random, scale_to_entropy

    shape = MODEL_SHAPES["tiny"]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**shape.config))
    initialise_random(model, 0)
    scale, before, after = scale_to_entropy(model, shape.vocab, 2.5, seed=0)
    assert before > 8.0  # the random init: near ln 32000 = 10.4
    assert scale > 1.0 and after == pytest.approx(2.5, abs=0.05)
    with pytest.raises(ValueError, match="head entropy must be in"):
        scale_to_entropy(model, shape.vocab, 11.0, seed=0)
