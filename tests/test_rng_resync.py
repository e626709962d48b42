"""Ranks that skip random draws (gather mode) hold rank 0's generator state again before they draw themselves.

Real gloo ranks. Every rank starts from the same seed, like an engine's TP ranks; a schedule of calls mixes
gather and all_gather, drawing and greedy. A rank "samples" by drawing from torch's default generator the way
SGLang's and vLLM's samplers do (torch.multinomial). The reference is every rank sampling every call.
"""

import pytest

from tests._dist import run_ranks

# (all_ranks_sample, draws) per call: gather calls skip the draw on rank 1; greedy calls draw nothing.
SCHEDULE = [(True, True), (False, True), (False, True), (True, False), (False, False), (True, True),
            (True, True), (False, True), (True, True), (False, False), (True, True)]


def _draw(rows: int):
    import torch

    probs = torch.softmax(torch.arange(64, dtype=torch.float32).repeat(rows, 1) / 16, dim=-1)
    return torch.multinomial(probs, 1).view(-1).tolist()


def _run(rank, world, schedule, resync):
    import torch

    from engine_hooks.comm import default_communicator
    from engine_hooks.rng_resync import RandomStateResync

    torch.manual_seed(1234)
    sync = RandomStateResync(default_communicator(), "cpu")
    drawn = []
    for step, (all_ranks_sample, draws) in enumerate(schedule):
        if resync:
            sync.before_call(all_ranks_sample, draws)
        if draws and (all_ranks_sample or rank == 0):
            drawn.append((step, _draw(3)))
    return {"drawn": drawn, "handovers": sync.handovers}


def _reference():
    import torch

    torch.manual_seed(1234)
    return [(step, _draw(3)) for step, (_, draws) in enumerate(SCHEDULE) if draws]


@pytest.mark.slow
def test_skipping_ranks_draw_what_they_would_have_drawn():
    results = run_ranks(_run, 2, SCHEDULE, True)
    reference = dict(_reference())
    for rank, result in enumerate(results):
        assert result["drawn"] and all(tokens == reference[step] for step, tokens in result["drawn"]), rank
    # handed over once per return from drawing gather calls to a drawing all_gather call: before steps 5 and 8
    assert [r["handovers"] for r in results] == [2, 2]


@pytest.mark.slow
def test_without_the_hand_over_ranks_diverge():
    """The control: the schedule really separates the generators, so the hand-over is what keeps them equal."""
    rank0, rank1 = run_ranks(_run, 2, SCHEDULE, False)
    ours = dict(rank1["drawn"])
    assert any(ours[step] != tokens for step, tokens in rank0["drawn"] if step in ours)


def test_greedy_and_single_rank_never_hand_over():
    from engine_hooks.comm import SingleRankCommunicator
    from engine_hooks.rng_resync import RandomStateResync

    sync = RandomStateResync(SingleRankCommunicator(), "cpu")
    for all_ranks_sample, draws in SCHEDULE:
        sync.before_call(all_ranks_sample, draws)
    assert sync.handovers == 0 and not sync.stale
