"""The logits path on real gloo ranks: same tokens in every mode and schedule, one switch point for all ranks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from tests._dist import run_ranks

if TYPE_CHECKING:
    from gatherwise.engine_hooks.logits_path import LogitsPath
    from gatherwise.engine_hooks.sampling import SamplingRow

SAMPLING = [(0.0, 0, 1.0), (0.8, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.9), (1.2, 40, 0.8)]
BATCHES = [1, 3, 8, 16, 2, 5, 7, 1, 12, 4]


def _rows(step: int, batch: int) -> list[SamplingRow]:
    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow

    params = [SamplingParams(t, k, p, seed=11) for t, k, p in SAMPLING]
    return [SamplingRow(params[i % len(params)], request_id=i, position=step) for i in range(batch)]


def _fill(path: LogitsPath, rank: int, full: torch.Tensor) -> None:
    buf = path.logits_buffer(full.shape[0])
    part = full[:, rank * path.width: (rank + 1) * path.width]
    buf[:, : part.shape[1]] = part.to(buf.dtype)


def _run_path(rank, world, vocab, mode, dtype_name, switch_at=None):
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.engine_hooks.table_source import InProcessTableSource, ScheduleTableSource, initial_schedule_table
    from gatherwise.modes import Mode, ModeTable

    source: ScheduleTableSource | InProcessTableSource | None = None
    if mode.startswith("schedule:"):
        seed = int(mode.split(":")[1])
        table, source = initial_schedule_table(seed), ScheduleTableSource(seed)
    else:
        table = ModeTable.uniform(Mode.parse(mode))
        if switch_at is not None:
            source = InProcessTableSource()
    path = LoggedLogitsPath(default_communicator(), vocab, dtype=getattr(torch, dtype_name), initial_table=table,
                            table_source=source)
    gen = torch.Generator().manual_seed(5)
    tokens = []
    reported_during: list[int] = []  # the call during which each report arrived
    for step, batch in enumerate(BATCHES):
        if switch_at == step and rank == 0:
            assert isinstance(source, InProcessTableSource)
            source.request(ModeTable.uniform(Mode.GATHER if mode == "all_gather" else Mode.ALL_GATHER))
        _fill(path, rank, torch.randn(batch, vocab, generator=gen))
        tokens.append(path.run(_rows(step, batch)).tolist())
        if isinstance(source, InProcessTableSource):
            reported_during += [step] * (len(source.applied) - len(reported_during))
    applied: list[tuple[int, int, int, int]] = []
    if isinstance(source, InProcessTableSource):
        applied = [(s.seq, s.apply_call, s.epoch, during)
                   for s, during in zip(source.applied, reported_during, strict=True)]
    return tokens, [m.label for m in path.mode_log], path.collective_log, path.epoch, applied


MODES = ["all_gather", "gather", "sharded", "schedule:3", "schedule:4"]


def _run_modes(rank, world, vocab, dtype_name):
    """One process group runs every mode (spawning ranks costs seconds; paths are cheap)."""
    return {mode: _run_path(rank, world, vocab, mode, dtype_name) for mode in MODES}


@pytest.fixture(scope="module")
def reference():
    return run_ranks(_run_path, 1, 1001, "all_gather", "float32", timeout=120)[0][0]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"P{w}")
def by_mode(request):
    per_rank = run_ranks(_run_modes, request.param, 1001, "float32", timeout=180)
    return {mode: [rank_result[mode] for rank_result in per_rank] for mode in MODES}


def _expected_collectives(modes: list[str], world: int) -> list[int]:
    """all_gather: 1; gather: 2 (gather + broadcast); sharded: 1, or 2 with temperature or top-p rows."""
    from gatherwise.engine_hooks.logits_path import shard_width
    from gatherwise.engine_hooks.sharded_exchange import collectives_for

    width = shard_width(1001, world)
    return [1 if m == "all_gather" else 2 if m == "gather" else collectives_for(_rows(step, batch), width)
            for step, (m, batch) in enumerate(zip(modes, BATCHES, strict=True))]


@pytest.mark.parametrize("mode", MODES)
def test_tokens_match_single_rank_and_ranks_agree_on_modes(reference, by_mode, mode):
    results = by_mode[mode]
    for tokens, modes, collectives, _, _ in results:
        assert tokens == reference
        assert modes == results[0][1]
        assert collectives == _expected_collectives(modes, len(results))
    if mode.startswith("schedule"):
        assert len(set(results[0][1])) >= 2, "the schedule should switch modes"
    else:
        assert set(results[0][1]) == {mode}


@pytest.mark.parametrize("first", ["all_gather", "gather"])
def test_requested_switch_applies_on_every_rank_at_the_reported_call(first):
    results = run_ranks(_run_path, 2, 999, first, "float32", 4, timeout=120)
    from gatherwise.engine_hooks.deferred_word import ADOPT_LAG

    assert ADOPT_LAG == 2  # part of the protocol: docs/architecture.md and docs/api.md say "two calls later"
    (seq, apply_call, epoch, reported_during), = results[0][4]
    assert (seq, apply_call, epoch) == (1, 6, 1)  # requested during call 4, carried by call 4, in force from 6
    assert reported_during == apply_call  # reported applied when it is: not while call 4's collective is pending
    other = "gather" if first == "all_gather" else "all_gather"
    for _, modes, _, final_epoch, _ in results:
        assert modes == [first] * 6 + [other] * (len(BATCHES) - 6)
        assert final_epoch == 1


def test_bfloat16_logits_agree_across_modes():
    all_gather = run_ranks(_run_path, 2, 1000, "all_gather", "bfloat16", timeout=120)
    gather = run_ranks(_run_path, 2, 1000, "gather", "bfloat16", timeout=120)
    assert all_gather[0][0] == gather[0][0] == gather[1][0]


def _mismatched_handshake(rank, world):
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.handshake import HandshakeError, handshake
    from gatherwise.modes import Mode, ModeTable

    table = ModeTable.uniform(Mode.GATHER if rank == 1 else Mode.ALL_GATHER)
    try:
        handshake(default_communicator(), config_hash=7, table=table, vocab=100, dtype=torch.float32)
    except HandshakeError as exc:
        return str(exc)
    return None


def test_handshake_refuses_mismatched_tables_on_every_rank():
    messages = run_ranks(_mismatched_handshake, 2, timeout=60)
    assert all(m and "rank 1 has a different initial table" in m for m in messages)


def test_run_without_filled_buffer_is_a_clear_error():
    from gatherwise.engine_hooks.comm import SingleRankCommunicator
    from gatherwise.engine_hooks.logits_path import LogitsPath
    from gatherwise.modes import Mode, ModeTable

    path = LogitsPath(SingleRankCommunicator(), 10, initial_table=ModeTable.uniform(Mode.GATHER))
    with pytest.raises(ValueError, match="logits_buffer"):
        path.run(_rows(0, 2))
    path.logits_buffer(2).zero_()
    with pytest.raises(ValueError, match="logits_buffer"):
        path.run(_rows(0, 3))


def _run_winners(rank, world, vocab):
    """Each rank scores its own shard (here: the argmax of values with planted ties) and run_winners picks the
    row's winner; compared with the full row's first argmax."""
    from gatherwise.call_kind import Sampling, call_kind
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.modes import Mode, ModeTable

    path = LoggedLogitsPath(default_communicator(), vocab, initial_table=ModeTable.uniform(Mode.SHARDED))
    full = torch.randint(0, 4, (6, vocab), generator=torch.Generator().manual_seed(3)).float()  # many exact ties
    full[5] = float("-inf")
    full[5, vocab - 1] = 0.0  # the only finite value, in the last shard
    first = rank * path.width
    shard = full[:, first:first + path.width]
    path.logits_buffer(full.shape[0])
    assert path.begin_call(full.shape[0]) == Mode.SHARDED
    local = shard.argmax(dim=1)  # torch's argmax: the first maximum
    values, ids = shard.gather(1, local[:, None]).squeeze(1), local + first
    tokens = path.run_winners(values, ids, call_kind(Sampling.TEMPERATURE), t_start=0, sample_start=0, sample_end=0)
    return tokens.tolist(), full.argmax(dim=1).tolist(), [m.label for m in path.mode_log]


def test_run_winners_gives_the_full_rows_first_argmax_on_every_rank():
    results = run_ranks(_run_winners, 2, 1001, timeout=120)
    for tokens, expected, modes in results:
        assert tokens == expected and modes == ["sharded"]
    assert results[0][0] == results[1][0]
