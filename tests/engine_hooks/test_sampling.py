"""Sampling semantics of gatherwise.engine_hooks.sampling: exact, layout-independent, randomness a pure function."""

from __future__ import annotations

import math

import pytest
import torch

from gatherwise.engine_hooks.logits_path import shard_width
from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow, row_uniform, sample
from gatherwise.engine_hooks.shard_sampling import shard_mass

PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.0, top_k=7, seed=2),
    SamplingParams(temperature=0.6, top_p=0.85, seed=3),
    SamplingParams(temperature=1.5, top_k=30, top_p=0.7, seed=4),
    SamplingParams(temperature=0.9, min_p=0.1, seed=5),
    SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05, seed=6),
    SamplingParams(temperature=1.2, top_k=25, min_p=0.2, seed=7),
]


def sharded(full: torch.Tensor, world: int) -> torch.Tensor:
    """[B, V] -> the received layout [P, B, width] with padding columns at -inf."""
    batch, vocab = full.shape
    width = shard_width(vocab, world)
    padded = full.new_full((batch, world * width), float("-inf"))
    padded[:, :vocab] = full
    return padded.view(batch, world, width).permute(1, 0, 2).contiguous()


def rows_for(params: SamplingParams, batch: int, position: int = 0) -> list[SamplingRow]:
    return [SamplingRow(params, request_id=i, position=position + i) for i in range(batch)]


def test_greedy_ties_go_to_the_lowest_index_in_every_layout():
    vocab = 37
    full = torch.zeros(4, vocab)
    full[0, [5, 20, 36]] = 3.0  # ties in different shards
    full[1, [19, 18]] = 2.0  # ties next to a shard border
    full[2, :] = 1.0  # everything tied
    full[3, [36, 0]] = 4.0
    for world in (1, 2, 3, 4):
        tokens = sample(sharded(full, world), vocab, rows_for(PARAMS[0], 4))
        assert tokens.tolist() == [5, 18, 0, 0], f"P={world}"


def test_top_k_keeps_exactly_the_k_largest_with_ties_by_index():
    vocab = 41
    full = torch.zeros(1, vocab)
    full[0, [3, 9, 17, 25, 33, 40]] = 5.0  # six tied at the top, spread over shards
    params = SamplingParams(temperature=1.0, top_k=4, seed=9)
    for world in (1, 2, 3):
        seen = set()
        for position in range(300):
            row = [SamplingRow(params, request_id=0, position=position)]
            seen.add(int(sample(sharded(full, world), vocab, row)))
        assert seen == {3, 9, 17, 25}, f"P={world}"


def test_top_p_keeps_the_shortest_prefix_reaching_p():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]], dtype=torch.float64)
    full = probs.log().to(torch.float32)
    params = SamplingParams(temperature=1.0, top_p=0.7, seed=4)
    seen = {int(sample(sharded(full, 2), 4, [SamplingRow(params, 0, p)])) for p in range(200)}
    assert seen == {1, 3}


def test_min_p_keeps_exactly_the_tokens_with_at_least_min_p_of_the_largest_probability():
    probs = torch.tensor([[0.40, 0.039, 0.2, 0.041, 0.32]], dtype=torch.float64)  # 0.1 * 0.40 = 0.04
    full = probs.log().to(torch.float32)
    for params in (SamplingParams(temperature=1.0, min_p=0.1, seed=4),
                   SamplingParams(temperature=1.0, top_k=4, min_p=0.1, seed=4),  # top-k 4 would keep 0.039 too
                   SamplingParams(temperature=1.0, top_p=0.99, min_p=0.1, seed=4)):
        for world in (1, 2, 3):
            seen = {int(sample(sharded(full, world), 5, [SamplingRow(params, 0, p)])) for p in range(300)}
            assert seen == {0, 2, 3, 4}, f"{params} P={world}"
    # top-p cuts first when its prefix is the shorter: 0.40 + 0.32 reaches 0.7
    params = SamplingParams(temperature=1.0, top_p=0.7, min_p=0.1, seed=4)
    assert {int(sample(sharded(full, 2), 5, [SamplingRow(params, 0, p)])) for p in range(300)} == {0, 4}


def test_min_p_must_be_a_fraction():
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="min_p must be in"):
            SamplingParams(temperature=1.0, min_p=bad)
    assert SamplingParams(0.8, 0, 0.9, 3) == SamplingParams(temperature=0.8, top_p=0.9, seed=3, min_p=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_tokens_for_every_layout(dtype):
    gen = torch.Generator().manual_seed(0)
    vocab, batch = 1001, 16
    full = (torch.randn(batch, vocab, generator=gen) * 3).to(dtype)
    for params in PARAMS:
        want = sample(sharded(full, 1), vocab, rows_for(params, batch))
        assert int(want.min()) >= 0 and int(want.max()) < vocab
        for world in (2, 3, 4, 5):
            got = sample(sharded(full, world), vocab, rows_for(params, batch))
            assert torch.equal(got, want), f"{params} P={world}"


def test_a_rows_token_does_not_depend_on_the_rest_of_the_batch():
    gen = torch.Generator().manual_seed(1)
    vocab = 300
    full = torch.randn(8, vocab, generator=gen) * 2
    rows = [SamplingRow(PARAMS[i % len(PARAMS)], request_id=10 + i, position=i) for i in range(8)]
    together = sample(sharded(full, 3), vocab, rows)
    alone = [int(sample(sharded(full[i: i + 1], 3), vocab, [rows[i]])) for i in range(8)]
    assert together.tolist() == alone


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_the_shard_masses_are_exactly_the_float64_curve_and_leave_the_logits_as_they_were(dtype):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(4, 257, generator=gen) * 3).to(dtype)
    x[1, 100:] = float("-inf")  # padding
    x[3] = float("-inf")  # an all-padding shard
    before = x.clone()
    m, cum = shard_mass(x, 0.7)
    assert torch.equal(x, before)
    ref = m.masked_fill(m == float("-inf"), 0.0)
    want = ((x.to(torch.float64) - ref[:, None]) / 0.7).exp().cumsum(dim=1)
    assert torch.equal(cum, want) and torch.equal(m, x.amax(dim=1).to(torch.float64))
    assert float(cum[3, -1]) == 0.0


def test_row_uniform_is_a_pure_function_of_seed_request_position():
    first = [row_uniform(s, r, p) for s in range(3) for r in range(3) for p in range(3)]
    row_uniform(123, 456, 789)  # no hidden state: other draws in between change nothing
    again = [row_uniform(s, r, p) for s in range(3) for r in range(3) for p in range(3)]
    assert first == again
    assert all(0.0 <= u < 1.0 for u in first)
    assert len(set(first)) == len(first)  # each of seed, request, position changes the draw
    many = [row_uniform(7, r, 0) for r in range(4000)]
    assert abs(sum(many) / len(many) - 0.5) < 0.02


LARGEST_BELOW_ONE = 1.0 - 2.0**-53  # the largest uniform row_uniform can return


@pytest.mark.parametrize("u", [LARGEST_BELOW_ONE, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_draw_at_the_top_of_the_cdf_stays_in_the_vocab(u, dtype, monkeypatch):
    """u at (or, forced, past) the end of the CDF: rounding puts the target at or beyond the last cumulative
    mass; the search must stop at the last real token with mass, never run into padding columns."""
    import gatherwise.engine_hooks.shard_sampling as shard_sampling

    monkeypatch.setattr(shard_sampling, "row_uniform", lambda *_: u)
    gen = torch.Generator().manual_seed(5)
    vocab, batch = 1001, 64  # P=3: width 336, the last shard has 329 real columns and 7 of padding
    full = (torch.randn(batch, vocab, generator=gen) * 2).to(dtype)
    full[: batch // 2, -40:] = -1e4  # rows whose last real columns carry no mass at all
    for params in PARAMS[1:]:
        for world in (1, 2, 3):
            tokens = sample(sharded(full, world), vocab, rows_for(params, batch))
            assert int(tokens.max()) < vocab, f"{params} P={world}"
            picked = full.gather(1, tokens[:, None]).squeeze(1).to(torch.float64)
            assert bool((torch.exp((picked - full.to(torch.float64).amax(1)) / params.temperature) > 0).all())


def test_the_in_shard_search_is_clamped_to_the_last_column_with_mass():
    from gatherwise.engine_hooks.shard_sampling import find_in_shard

    cum = torch.tensor([[0.5, 1.0, 1.0, 1.0], [0.25, 0.5, 0.75, 1.0]], dtype=torch.float64)  # row 0: 2 zero columns
    beyond = torch.tensor([1.0 + 2**-52, 1.0], dtype=torch.float64)  # targets past the end by rounding
    assert find_in_shard(cum, beyond).tolist() == [1, 3]
    assert torch.searchsorted(cum, beyond[:, None], right=True).squeeze(1).tolist() == [4, 4]  # unclamped: past


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_cuda_top_k_without_host_decisions_keeps_the_same_set(dtype):
    """canonical_top (what CUDA runs: one top-k over tie-free keys) against the CPU way (float top-k, border ties
    rebuilt on the host), on rows full of ties, signed zeros and -inf padding: the same k best, in canonical
    order (value desc, index asc)."""
    from gatherwise.engine_hooks.shard_sampling import canonical_top, shard_top

    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-4, 4, (32, 300), generator=gen).to(dtype) / 2
    x[0, :10] = -0.0
    x[0, 10:20] = 0.0
    x[1, 250:] = float("-inf")
    x[2] = float("-inf")
    for k in (1, 7, 64, 300, 400):
        vals, local = canonical_top(x, k)
        ref_vals, ref_local = shard_top(x, k)
        for b in range(x.shape[0]):
            order = x[b].float().argsort(descending=True, stable=True)[:k]
            assert torch.equal(local[b], order), (k, b)
            assert set(ref_local[b].tolist()) == set(order.tolist()), (k, b)
        assert vals.dtype == ref_vals.dtype == torch.float64
        assert torch.equal(vals, x.gather(1, local).double())


def test_wide_shards_send_more_top_p_candidates_and_the_tokens_stay_the_same():
    """Top-p / min-p candidates per shard grow with the width past TOP_P_CANDIDATES x COLUMNS_PER_CANDIDATE
    columns, never past the width; the plan's groups carry that count; the tokens are the same at any count."""
    from gatherwise.engine_hooks import shard_sampling as ss

    assert [ss.top_p_candidates(w) for w in (10, 64, 16_384, 76_032, 131_072)] == [10, 64, 64, 74, 128]
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=3)
    rows = [SamplingRow(params, request_id=i, position=i) for i in range(4)]
    assert [g.k for g in ss.plan(rows, 131_072)] == [128]
    gen = torch.Generator().manual_seed(2)
    full = torch.randn(4, 6000, generator=gen) * torch.tensor([0.5, 1.5, 3.0, 6.0])[:, None]
    x = sharded(full, 2)
    tokens = []
    for columns in (1 << 30, 16, 1):  # 64, 187, 3000 candidates (each shard whole: no fallback)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ss, "COLUMNS_PER_CANDIDATE", columns)
            tokens.append(sample(x, 6000, rows))
    assert all(torch.equal(t, tokens[0]) for t in tokens)


def test_whole_rows_are_the_canonical_merge_of_whole_shards():
    """The full-row fallback's one sort gives what merging every shard's every column gives, ties included."""
    from gatherwise.engine_hooks.shard_sampling import merge_candidates, whole_rows

    shards, rows, width = 3, 4, 50
    x = torch.randint(-5, 5, (shards, rows, width), generator=torch.Generator().manual_seed(3)).float()
    x[-1, :, -7:] = float("-inf")  # the padding of the last shard
    ids = torch.arange(shards * width).view(shards, 1, width).expand(shards, rows, width)
    want_vals, want_ids = merge_candidates(x.to(torch.float64), ids, shards * width)
    vals, got_ids = whole_rows(x)
    assert torch.equal(vals, want_vals) and torch.equal(got_ids, want_ids)


FALLBACK_PARAMS = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.0, min_p=0.02),
                   SamplingParams(temperature=0.7, top_p=0.9, min_p=0.01)]


@pytest.mark.parametrize("params", FALLBACK_PARAMS, ids=["top-p", "min-p", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fallback_gives_the_whole_rows_token_however_it_sizes_its_rounds(params, dtype, monkeypatch):
    """The full-row fallback sizes its rounds from what the candidates showed (min-p's exact count, top-p's mass
    bound); whatever size a row finishes at, its token is the one an inverse CDF over the whole sorted row gives."""
    from gatherwise.engine_hooks import shard_sampling as ss

    gen = torch.Generator().manual_seed(11)
    scales = torch.tensor([0.3, 1.0, 3.0, 8.0])[:, None]  # flat ... peaked rows in one batch
    full = (torch.randn(4, 3001, generator=gen) * scales).to(dtype)
    x = sharded(full, 3)
    group = ss.Group(ss.Kind.TOP_P, params, tuple(range(4)), 16)
    m = x.to(torch.float64).amax(dim=2)
    s = torch.exp((x.to(torch.float64) - m[:, :, None]) / params.temperature).sum(dim=2)
    u = torch.tensor([0.01, 0.5, 0.93, 1.0 - 2.0 ** -53], dtype=torch.float64)
    draw = ss.draw_shard(m, s, params.temperature, u)
    vals, ids = ss.whole_rows(x)
    want = ss.draw_candidates(vals, ids, params, u, draw.top, draw.total)
    for limit in (1, 4, 64, 1 << 20):  # whole rows at once ... candidates growing up to a quarter row
        monkeypatch.setattr(ss, "FALLBACK_DOUBLING_LIMIT", limit)
        assert torch.equal(ss.sample_top_p_rows(group, x, draw, u, x.shape[2]), want), limit


def test_the_next_round_is_sized_to_what_could_reach_the_nucleus():
    from gatherwise.engine_hooks.shard_sampling import min_p_kept, next_candidates

    params = SamplingParams(temperature=1.0, top_p=0.9)
    flat = torch.zeros(1, 64, dtype=torch.float64)  # 64 of 100 000 equal tokens: 90 000 needed at least
    assert next_candidates(flat, params, torch.zeros(1), torch.tensor([100_000.0], dtype=torch.float64)) >= 90_000
    peaked = torch.tensor([[0.0] + [-3.0] * 63], dtype=torch.float64)  # close to covered: twice the candidates
    total = torch.exp(peaked).sum(dim=1) * 1.02
    assert next_candidates(peaked, params, torch.zeros(1), total) == 128
    rows = torch.tensor([[[0.0, -1.0, -2.0, -3.0]], [[-0.5, -10.0, float("-inf"), float("-inf")]]])  # [P=2, n=1, 4]
    min_p = SamplingParams(temperature=1.0, min_p=math.exp(-2.0))  # keeps logits >= -2
    assert min_p_kept(rows, min_p, torch.zeros(1, dtype=torch.float64)).tolist() == [4]
