"""Sharded mode on real gloo ranks: the same tokens as all_gather and gather, bit for bit, at P = 1, 2, 3.

One spawn per P runs every case: the three static modes and 60 random three-mode switch schedules, over greedy,
top-k, top-p, min-p (covered by the candidates and falling back), temperature-only and mixed batches, odd vocab sizes,
float32 and bfloat16. Each rank reports its tokens, its per-call mode log, the collectives its path says it ran
and the collectives it really issued, and what its recorder received.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
from gatherwise.engine_hooks.logits_path import shard_width
from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow, sample
from gatherwise.engine_hooks.sharded_exchange import collectives_for
from gatherwise.modes import IMPLEMENTED, Mode
from gatherwise.tp_engine.launch import launch
from gatherwise.tp_engine.runner import mode_setup
from tests._counting_comm import CountingComm

GREEDY = SamplingParams()
TOP_K = SamplingParams(temperature=0.9, top_k=7, seed=1)
TOP_K_BIG = SamplingParams(temperature=1.1, top_k=300, seed=2)  # more than a shard: every candidate of it
TOP_P = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
TOP_P_SMALL = SamplingParams(temperature=1.0, top_p=0.3, seed=4)
TEMPERATURE = SamplingParams(temperature=0.7, seed=5)
TOP_K_P = SamplingParams(temperature=1.3, top_k=20, top_p=0.8, seed=6)
MIN_P = SamplingParams(temperature=0.9, min_p=0.1, seed=7)
TOP_P_MIN_P = SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05, seed=8)
TOP_K_MIN_P = SamplingParams(temperature=1.1, top_k=40, min_p=0.2, seed=9)
ALL = (GREEDY, TOP_K, TOP_K_BIG, TOP_P, TOP_P_SMALL, TEMPERATURE, TOP_K_P, MIN_P, TOP_P_MIN_P, TOP_K_MIN_P)
NUM_SCHEDULES = 60
SPAWN_TIMEOUT = 300


@dataclass(frozen=True)
class Case:
    name: str
    vocab: int
    mode: str  # a mode label or schedule:SEED
    params: tuple[SamplingParams, ...]  # drawn per row
    sizes: tuple[int, ...]  # rows of each call
    dtype: str = "float32"
    scale: float = 3.0  # logits = scale * randn: large is peaked (top-p covered), small is flat (fallback)
    seed: int = 0


def full_logits(case: Case, call: int, rows: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(case.seed * 1000 + call)
    x = torch.randn(rows, case.vocab, generator=gen, dtype=torch.float64) * case.scale
    if call % 3 == 0:  # ties across shards and at the top-k border
        x[:, ::5] = x[:, :1]
    return x.to(getattr(torch, case.dtype))


def sampling_rows(case: Case, call: int, rows: int) -> list[SamplingRow]:
    rng = random.Random(case.seed * 7919 + call)
    return [SamplingRow(rng.choice(case.params), request_id=100 * call + i, position=call) for i in range(rows)]


class ListRecorder:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def record(self, m: CallMarks, /) -> None:
        self.calls.append(dict(mode=int(m.mode), rows=m.rows, nbytes=m.nbytes, second=bool(m.second_start),
                               resolve_nbytes=m.resolve_nbytes, topp_rows=m.topp_rows,
                               fallback_rows=m.fallback_rows, tag=m.tag))


def run_cases(rank: int, world: int, cases: list[Case]) -> list[dict]:
    from gatherwise.engine_hooks.comm import default_communicator

    torch.set_num_threads(1)
    comm = CountingComm(default_communicator())
    out = []
    for case in cases:
        table, source = mode_setup(case.mode)
        recorder = ListRecorder()
        path = LoggedLogitsPath(comm, case.vocab, dtype=getattr(torch, case.dtype), initial_table=table,
                                table_source=source() if rank == 0 else None, recorder=recorder)
        width = path.width
        tokens, counted = [], []
        for call, rows in enumerate(case.sizes):
            full = full_logits(case, call, rows)
            shard = torch.full((rows, width), float("-inf"), dtype=full.dtype)
            cols = full[:, rank * width:(rank + 1) * width]
            shard[:, :cols.shape[1]] = cols
            path.logits_buffer(rows).copy_(shard)
            before = comm.count
            tokens.append(path.run(sampling_rows(case, call, rows)).tolist())
            counted.append(comm.count - before)
        out.append(dict(tokens=tokens, modes=[m.label for m in path.mode_log], collectives=path.collective_log,
                        counted=counted, records=recorder.calls))
    return out


def build_cases() -> list[Case]:
    cases = []
    kinds = {"greedy": (GREEDY,), "top-k": (TOP_K, TOP_K_BIG), "top-p": (TOP_P, TOP_P_SMALL),
             "temperature": (TEMPERATURE,), "min-p": (MIN_P, TOP_P_MIN_P, TOP_K_MIN_P), "mixed": ALL}
    for mode in ("all_gather", "gather", "sharded"):
        for kind, params in kinds.items():
            cases.append(Case(f"{mode} {kind} 1001 float32", 1001, mode, params, (1, 7, 16, 3), seed=1))
            cases.append(Case(f"{mode} {kind} 203 bfloat16", 203, mode, params, (5, 2, 12), "bfloat16", seed=2))
        cases.append(Case(f"{mode} flat top-p 509", 509, mode, (TOP_P, TOP_K_P, GREEDY), (9, 4), scale=0.05, seed=3))
        # flat logits: min-p keeps nearly every column, so its rows fall back to the full rows too
        cases.append(Case(f"{mode} flat min-p 509", 509, mode, (MIN_P, TOP_P_MIN_P), (6, 3), scale=0.05, seed=6))
        cases.append(Case(f"{mode} peaked top-p 1001", 1001, mode, (TOP_P, TOP_P_SMALL), (4, 11), scale=10.0, seed=5))
        cases.append(Case(f"{mode} tiny vocab 5", 5, mode, ALL, (6, 1), seed=4))  # a shard of padding only at P=3
    for s in range(NUM_SCHEDULES):
        vocab, dtype = (1001, "float32") if s % 2 else (331, "bfloat16")
        sizes = tuple(random.Random(s).choice((1, 2, 3, 5, 8, 13, 20)) for _ in range(12))
        cases.append(Case(f"schedule:{s}", vocab, f"schedule:{500 + s}", ALL, sizes, dtype,
                          scale=(3.0, 0.05)[s % 3 == 0], seed=10 + s))
    return cases


CASES = build_cases()
_RUNS: dict[int, list[list[dict]]] = {}


def runs(world: int) -> list[list[dict]]:
    if world not in _RUNS:
        _RUNS[world] = launch(run_cases, world, CASES, timeout=SPAWN_TIMEOUT)
    return _RUNS[world]


def reference_tokens(case: Case, world: int) -> list[list[int]]:
    """The all_gather sampler on the full received layout [P, B, W], in this process."""
    width = shard_width(case.vocab, world)
    out = []
    for call, rows in enumerate(case.sizes):
        full = full_logits(case, call, rows)
        padded = full.new_full((rows, world * width), float("-inf"))
        padded[:, :case.vocab] = full
        layout = padded.view(rows, world, width).permute(1, 0, 2).contiguous()
        out.append(sample(layout, case.vocab, sampling_rows(case, call, rows)).tolist())
    return out


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_same_tokens_in_every_mode_and_schedule(world):
    ranks = runs(world)
    for i, case in enumerate(CASES):
        want = reference_tokens(case, world)
        assert all(0 <= t < case.vocab for call in want for t in call), case.name
        for rank, result in enumerate(ranks):
            assert result[i]["tokens"] == want, f"{case.name}: P={world} rank {rank} differs from the sampler"
        if world > 1:
            assert want == reference_tokens(case, 1), f"{case.name}: P={world} differs from P=1"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_modes_agree_and_collectives_are_fixed_by_mode_and_kinds(world):
    ranks = runs(world)
    for i, case in enumerate(CASES):
        modes = ranks[0][i]["modes"]
        width = shard_width(case.vocab, world)
        want = []
        for call, (mode, rows) in enumerate(zip(modes, case.sizes, strict=True)):
            if mode == "sharded":
                want.append(collectives_for(sampling_rows(case, call, rows), width))
            else:
                want.append(1 if mode == "all_gather" else 2)
        for rank, result in enumerate(ranks):
            got = result[i]
            assert got["modes"] == modes, f"{case.name}: rank {rank} modes differ"
            assert got["collectives"] == want and got["counted"] == want, f"{case.name}: rank {rank}"
        if not case.mode.startswith("schedule:"):
            assert set(modes) == {case.mode}


def test_schedules_switch_among_all_three_modes():
    schedules = [i for i, c in enumerate(CASES) if c.mode.startswith("schedule:")]
    assert len(schedules) >= 50
    seen = [set(runs(2)[0][i]["modes"]) for i in schedules]
    assert set().union(*seen) == {m.label for m in IMPLEMENTED}
    assert sum(len(s) >= 2 for s in seen) >= 30
    assert sum(len(s) == 3 for s in seen) >= 5


def test_sharded_calls_are_recorded_with_their_own_ops_and_fallbacks():
    world = 2
    ranks = runs(world)
    flat = CASES.index(next(c for c in CASES if c.name == "sharded flat top-p 509"))
    peaked = CASES.index(next(c for c in CASES if c.name == "sharded peaked top-p 1001"))
    greedy = CASES.index(next(c for c in CASES if c.name == "sharded greedy 1001 float32"))
    ag = CASES.index(next(c for c in CASES if c.name == "all_gather greedy 1001 float32"))
    for rank in range(world):
        flat_calls = ranks[rank][flat]["records"]
        assert all(c["mode"] == Mode.SHARDED and c["second"] for c in flat_calls)
        # flat logits: the 64 best of a shard never hold 90 % of the mass, so every top-p row falls back
        assert sum(c["fallback_rows"] for c in flat_calls) == sum(c["topp_rows"] for c in flat_calls) > 0
        assert all(c["resolve_nbytes"] > 0 for c in flat_calls)
        flat_min_p = ranks[rank][CASES.index(next(c for c in CASES if c.name == "sharded flat min-p 509"))]["records"]
        assert sum(c["fallback_rows"] for c in flat_min_p) == sum(c["topp_rows"] for c in flat_min_p) == 9
        peaked_calls = ranks[rank][peaked]["records"]
        assert sum(c["topp_rows"] for c in peaked_calls) == sum(CASES[peaked].sizes)
        assert sum(c["fallback_rows"] for c in peaked_calls) == 0
        for c, rows in zip(ranks[rank][greedy]["records"], CASES[greedy].sizes, strict=True):
            # one collective: (max, index) per row plus the control word, from each of the P ranks
            assert not c["second"] and c["resolve_nbytes"] == 0 and c["nbytes"] == world * (1 + 2 * rows) * 8
        for c, rows in zip(ranks[rank][ag]["records"], CASES[ag].sizes, strict=True):
            assert c["nbytes"] == world * (rows * shard_width(1001, world) * 4 + 8)  # shards + control word
