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


def _draw(rows: int) -> list[int]:
    import torch

    probs = torch.softmax(torch.arange(64, dtype=torch.float32).repeat(rows, 1) / 16, dim=-1)
    return torch.multinomial(probs, 1).view(-1).tolist()


def _run(rank, world, schedule, resync):
    import torch

    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.rng_resync import RandomStateResync

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
    from gatherwise.engine_hooks.comm import SingleRankCommunicator
    from gatherwise.engine_hooks.rng_resync import RandomStateResync

    sync = RandomStateResync(SingleRankCommunicator(), "cpu")
    for all_ranks_sample, draws in SCHEDULE:
        sync.before_call(all_ranks_sample, draws)
    assert sync.handovers == 0 and not sync.stale


# Seeded requests draw from generators of their own, built alike on every rank from the request's seed (vLLM).
# (all_ranks_sample, {request: seed} of the batch's seeded rows) per call; request "b" joins late, "a" leaves.
SEEDED = [(True, ("a",)), (False, ("a",)), (False, ("a", "b")), (True, ("a", "b")), (False, ("b",)),
          (True, ("b",)), (False, ("a", "b")), (True, ("b",)), (True, ("a", "b"))]
SEEDS = {"a": 11, "b": 22}


def _run_seeded(rank, world, schedule):
    import torch

    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.rng_resync import RandomStateResync

    sync = RandomStateResync(default_communicator(), "cpu")
    generators: dict[int, torch.Generator] = {}
    drawn = []
    for step, (all_ranks_sample, requests) in enumerate(schedule):
        for r in requests:
            generators.setdefault(r, torch.Generator().manual_seed(SEEDS[r]))
        sync.before_call(all_ranks_sample, False, {r: generators[r] for r in requests})
        if all_ranks_sample or rank == 0:
            drawn.append((step, [torch.randint(0, 2**31, (1,), generator=generators[r]).item() for r in requests]))
    return {"drawn": drawn, "handed_over": sync.request_handovers, "stale": sorted(sync.stale_requests)}


def _seeded_reference():
    import torch

    generators = {r: torch.Generator().manual_seed(s) for r, s in SEEDS.items()}
    return {step: [torch.randint(0, 2**31, (1,), generator=generators[r]).item() for r in requests]
            for step, (_, requests) in enumerate(SEEDED)}


@pytest.mark.slow
def test_seeded_requests_draw_what_they_would_have_drawn():
    results = run_ranks(_run_seeded, 2, SEEDED)
    reference = _seeded_reference()
    for rank, result in enumerate(results):
        assert result["drawn"] and all(draws == reference[step] for step, draws in result["drawn"]), rank
    # each stale request's state travels once, right before the next call where every rank draws for it:
    # step 3 (a, b), step 5 (b), step 7 (b, not a: it is not in that batch), step 8 (a)
    assert [r["handed_over"] for r in results] == [5, 5]
    assert [r["stale"] for r in results] == [[], []]


def test_finished_requests_are_forgotten():
    from gatherwise.engine_hooks.comm import SingleRankCommunicator
    from gatherwise.engine_hooks.rng_resync import RandomStateResync

    sync = RandomStateResync(SingleRankCommunicator(), "cpu")
    sync.stale_requests.update({"a", "b"})
    sync.finished(["a", "c"])
    assert sync.stale_requests == {"b"}
