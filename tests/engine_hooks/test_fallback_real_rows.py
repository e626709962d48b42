"""The top-p / min-p fallback on a trained model's own rows: SmolLM2's next-token logits over real chat prompts,
the rows whose top-p 0.95 nucleus at T 1.0 overflows a shard's candidates. Every such row's token is the one the
inverse CDF over its whole sorted row gives (what the fallback gave when it sorted whole rows), in every layout,
dtype and mode, and no such row sorts its whole row."""

from __future__ import annotations

import pytest
import torch

import gatherwise.engine_hooks.shard_sampling as ss
from gatherwise.bench.real_rows import kept_sizes, shard_overflow
from gatherwise.bench.sampler import ReplayRank
from gatherwise.engine_hooks.logits_path import shard_width
from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow, sample
from tests._trained_models import model_directory, prompt_ids
from tests.engine_hooks.test_sampling import sharded as layout

PARAMS = [SamplingParams(temperature=1.0, top_p=0.95, seed=1), SamplingParams(temperature=0.8, top_p=0.95, seed=2),
          SamplingParams(temperature=1.0, top_p=0.9, min_p=0.001, seed=3),
          SamplingParams(temperature=1.0, min_p=0.0005, seed=4)]
IDS = ["T1 top-p", "T0.8 top-p", "top-p + min-p", "min-p"]


@pytest.fixture(scope="module")
def overflowing() -> torch.Tensor:
    """[24, 49152] float32: SmolLM2's rows over its chat prompts whose T 1.0 nucleus overflows a TP 3 shard."""
    from transformers import AutoModelForCausalLM

    directory = model_directory("smollm2")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        rows = torch.cat([model(torch.tensor([ids])).logits[0] for ids in prompt_ids(directory, 4)]).float()
    kept, order = kept_sizes(rows, 1.0, 0.95)
    width = shard_width(rows.shape[1], 3)
    over = shard_overflow(order, kept, width, ss.top_p_candidates(width))
    assert int(over.sum()) >= 16, "the prompts give too few overflowing rows to test the fallback on"
    return rows[over][:24].contiguous()


def rows_for(params: SamplingParams, batch: int) -> list[SamplingRow]:
    return [SamplingRow(params, request_id=i, position=7 * i + 1) for i in range(batch)]


def whole_row_tokens(x: torch.Tensor, params: SamplingParams, rows: list[SamplingRow]) -> torch.Tensor:
    """The inverse CDF over every row sorted whole, with the row max and total mass the sampler's summaries give."""
    num_shards, _, width = x.shape
    group = ss.plan(rows, width)[0]
    summaries = torch.stack([ss.summarize(group, x[r], r, width)[0] for r in range(num_shards)])
    u = group.uniforms(rows, x.device)
    draw = ss.draw_shard(summaries[:, :, 0], summaries[:, :, 1], params.temperature, u)
    vals, ids = ss.whole_rows(x)
    return ss.draw_candidates(vals, ids, params, u, draw.top, draw.total)


@pytest.mark.parametrize("params", PARAMS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("world", [2, 3])
def test_overflowing_rows_get_the_whole_sorted_rows_token(overflowing: torch.Tensor, params: SamplingParams,
                                                           dtype: torch.dtype, world: int) -> None:
    x = layout(overflowing.to(dtype), world)
    rows = rows_for(params, x.shape[1])
    want = whole_row_tokens(x, params, rows)
    assert torch.equal(sample(x, overflowing.shape[1], rows), want)


@pytest.mark.parametrize("params", PARAMS[:2], ids=IDS[:2])
def test_a_sharded_rank_gives_the_same_tokens(overflowing: torch.Tensor, params: SamplingParams) -> None:
    x = layout(overflowing, 3)
    rows = rows_for(params, x.shape[1])
    rank = ReplayRank(x, rows, x.shape[2])
    assert torch.equal(rank.run(rank.shards[0]), whole_row_tokens(x, params, rows))
    assert rank.last.fallback_rows > 0  # some did take the fallback (at T 1.0 all do)


def test_no_real_row_sorts_its_whole_row(overflowing: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cuts hold every such row's kept tokens: no candidate rounds, no sort of a whole row."""
    def refuse(*_: object) -> None:
        raise AssertionError("a real row went past the cuts")

    monkeypatch.setattr(ss, "candidate_rounds", refuse)
    for params in PARAMS:
        x = layout(overflowing, 3)
        sample(x, overflowing.shape[1], rows_for(params, x.shape[1]))


@pytest.mark.parametrize("depths", [(0.0,), (0.5, 2.0), (0.0, 1e9)], ids=["max only", "shallow", "everything"])
def test_cuts_that_miss_go_deeper_then_to_rounds_with_the_same_tokens(overflowing: torch.Tensor,
                                                                      depths: tuple[float, ...],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut at the max alone holds too little mass (rounds take the row), shallow ones miss then reach or not,
    a cut below everything is the whole row: the token never changes."""
    x = layout(overflowing[:6], 3)
    for params in PARAMS:
        rows = rows_for(params, x.shape[1])
        want = whole_row_tokens(x, params, rows)
        monkeypatch.setattr(ss, "CUT_DEPTHS", depths)
        assert torch.equal(sample(x, overflowing.shape[1], rows), want), params
        monkeypatch.undo()


def test_a_cut_holds_every_token_at_or_above_its_limit_as_a_canonical_prefix() -> None:
    """Limits between two values of the logits' dtype: the cut holds every logit >= the limit in float64 (rounding
    the limit to the dtype never drops one) and is a prefix of the canonical order (value desc, ties by index)."""
    row = torch.tensor([[1.0, 3.0, 2.0, 3.0], [2.0, 0.5, 3.0, -1.0]])  # two shards of width 4
    x = row.flatten().double().tolist()
    canonical = sorted(range(8), key=lambda i: (-x[i], i))
    for dtype in (torch.float32, torch.bfloat16):
        for limit in (2.0 - 2.0 ** -30, 2.0 + 2.0 ** -30, 2.0 + 2.0 ** -22, 2.5, 3.0, -5.0):
            vals, ids = ss.nucleus_cut(row.to(dtype), limit, 4)
            assert ids[0].tolist() == canonical[:ids.shape[1]], (dtype, limit)
            assert {i for i in range(8) if x[i] >= limit} <= set(ids[0].tolist()), (dtype, limit)
            assert vals.dtype == torch.float64 and vals[0].tolist() == [x[i] for i in ids[0].tolist()]
    assert ss.nucleus_cut(row, 2.0 + 2.0 ** -22, 4)[1].tolist() == [[1, 3, 6]]  # the next float32 above 2
