"""The real-rows measurement's arithmetic (gatherwise_bench/real_rows.py): nucleus sizes as the sampler counts
them, and which rows overflow a shard's candidates."""

from __future__ import annotations

import torch

from gatherwise.bench.real_rows import kept_sizes, percentiles, shard_overflow
from gatherwise.bench.realistic_logits import nucleus_sizes


def test_kept_sizes_are_the_samplers_nucleus_sizes():
    rows = torch.randn(6, 500, generator=torch.Generator().manual_seed(3)) * torch.tensor([[0.5], [1], [2], [4],
                                                                                            [8], [16]])
    for temperature in (0.8, 1.0):
        kept, _ = kept_sizes(rows, temperature, 0.95)
        assert kept.tolist() == nucleus_sizes(rows, temperature, 0.95).tolist()


def test_a_row_overflows_when_one_shard_holds_more_kept_tokens_than_its_candidates():
    width, candidates = 10, 3
    row = torch.full((1, 30), -100.0)
    row[0, [0, 1, 2, 3]] = 5.0  # four equally likely tokens, all in shard 0: more than its 3 candidates
    kept, order = kept_sizes(row, 1.0, 0.95)
    assert int(kept[0]) == 4 and bool(shard_overflow(order, kept, width, candidates)[0])
    row[0, [2, 3]], row[0, [12, 23]] = -100.0, 5.0  # the same four spread over three shards: they fit
    kept, order = kept_sizes(row, 1.0, 0.95)
    assert int(kept[0]) == 4 and not bool(shard_overflow(order, kept, width, candidates)[0])


def test_percentiles():
    assert percentiles(list(range(1, 101))) == {"median": 50.5, "p90": 91.0, "p99": 100.0, "max": 100.0}
