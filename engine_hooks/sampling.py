"""The sampler of the all_gather and gather modes: the full received layout `[P, B, W]`, never concatenated.

Shard r holds global columns r*W .. r*W+W-1; columns >= vocab are padding at -inf. The sampler runs the
canonical per-shard computations of gatherwise.engine_hooks.shard_sampling on each shard and combines them exactly as a
sharded rank does after its exchange, so all three modes give the same token bit for bit (the semantics are
documented there). Randomness: one counter-based uniform per row (gatherwise.engine_hooks.sampling_params).
"""

from __future__ import annotations

import torch

from gatherwise.engine_hooks.sampling_params import SamplingParams, SamplingRow, row_uniform
from gatherwise.engine_hooks.shard_sampling import (
    Kind,
    combine_greedy,
    combine_top_k,
    draw_candidates,
    draw_shard,
    find_in_shard,
    plan,
    sample_top_p_rows,
    select_rows,
    summarize,
    token_slots,
    top_p_covered,
)

__all__ = ["SamplingParams", "SamplingRow", "row_uniform", "sample"]


def sample(shards: torch.Tensor, vocab: int, rows: list[SamplingRow]) -> torch.Tensor:
    """Tokens for every row: int64 [B]. `shards` is [P, B, W]; columns >= vocab must already be -inf."""
    num_shards, batch, width = shards.shape
    if batch != len(rows):
        raise ValueError(f"{batch} logit rows but {len(rows)} sampling rows")
    tokens = torch.empty(batch, dtype=torch.int64, device=shards.device)
    for g in plan(rows, width):
        index = token_slots(g, batch, shards.device)
        parts = [summarize(g, select_rows(shards[r], g.rows), r, width) for r in range(num_shards)]
        summaries = torch.stack([summary for summary, _ in parts])
        if g.kind == Kind.GREEDY:
            tokens[index] = combine_greedy(summaries)
            continue
        u = g.uniforms(rows, shards.device)
        if g.kind == Kind.TOP_K:
            tokens[index] = combine_top_k(g, summaries, u)
            continue
        draw = draw_shard(summaries[:, :, 0], summaries[:, :, 1], g.params.temperature, u)
        if g.kind == Kind.FULL:
            found = torch.empty_like(draw.shard)
            for r, (_, cum) in enumerate(parts):  # each shard's owner search, as that rank would run it
                assert cum is not None  # summarize gives temperature rows their cumulative masses
                found = torch.where(draw.shard == r, find_in_shard(cum, draw.target) + r * width, found)
            tokens[index] = found
            continue
        assert isinstance(index, torch.Tensor)  # token_slots: top-p rows always get an index, never a slice
        vals, ids, covered = top_p_covered(g, summaries, draw, width)
        if bool(covered.any()):
            tokens[index[covered]] = draw_candidates(vals[covered], ids[covered], g.params, u[covered],
                                                     draw.top[covered], draw.total[covered])
        missing = (~covered).nonzero().flatten()
        if missing.numel():
            x = shards.index_select(1, index[missing])
            tokens[index[missing]] = sample_top_p_rows(g, x, draw.select(missing), u[missing], width)
    return tokens
