"""ModeGraphs on CPU: one captured variant per (mode, rows), the variant chosen on the host before replay.

No GPU here, so graphs are stood in for by StandInGraphBackend: "replay" runs the captured function again with
the path in capture mode (device work only, exactly what a CUDA graph replays) and writes the results into the
outputs returned at capture, as a graph's static outputs. Real capture and replay on CUDA: the `graphs` check of
tests/machine/gpu_checks.py, which scripts/gpu_check.sh runs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests._dist import run_ranks

VOCAB = 999
STEPS = [1, 4, 4, 1, 4, 1, 1, 4, 4, 1]


class StandInGraph:
    """Stands in for torch.cuda.CUDAGraph: replay() re-runs the captured device work into the static outputs."""

    def __init__(self, fn: Callable[[], Any], out: Any) -> None:
        self.fn, self.out, self.replays = fn, out, 0

    def replay(self) -> None:
        new = self.fn()
        if isinstance(self.out, torch.Tensor):
            self.out.copy_(new)
        self.replays += 1


class StandInGraphBackend:
    def __init__(self) -> None:
        self.graphs: list[StandInGraph] = []

    def capture(self, fn):
        out = fn()
        self.graphs.append(StandInGraph(fn, out))
        return self.graphs[-1], out


def _logits(step: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(100 + step))


def _graphed_run(rank, world, exchange_only):
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.graphs import CAPTURABLE, ModeGraphs
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow
    from gatherwise.engine_hooks.table_source import InProcessTableSource
    from gatherwise.modes import Mode, ModeTable

    source = InProcessTableSource()
    table = ModeTable.uniform(Mode.ALL_GATHER)
    path = LoggedLogitsPath(default_communicator(), VOCAB, initial_table=table, table_source=source)
    eager_source = InProcessTableSource()
    eager = LoggedLogitsPath(default_communicator(), VOCAB, initial_table=table, table_source=eager_source)
    path.reserve(4)
    inputs = {rows: torch.zeros(rows, VOCAB) for rows in (1, 4)}  # the engine's static input buffers
    rows_of = {rows: [SamplingRow(SamplingParams(), request_id=i, position=0) for i in range(rows)] for rows in inputs}

    def step(rows):  # what the engine captures: the LM head's write, then the path
        part = inputs[rows][:, rank * path.width: (rank + 1) * path.width]
        path.logits_buffer(rows)[:, : part.shape[1]] = part
        if not exchange_only:
            return path.run(rows_of[rows])
        _mode, shards = path.exchange()
        return shards  # sampled after the replay

    backend = StandInGraphBackend()
    graphs = ModeGraphs(path, backend)
    for mode in CAPTURABLE:
        for rows in inputs:
            graphs.capture(mode, rows, functools.partial(step, rows))
    assert path.call_index == 0 and sum(g.replays for g in backend.graphs) == 0  # capture ran no call

    tokens, eager_tokens = [], []
    for i, rows in enumerate(STEPS):
        if i == 3 and rank == 0:
            source.request(ModeTable.uniform(Mode.GATHER))
            eager_source.request(ModeTable.uniform(Mode.GATHER))
        inputs[rows].copy_(_logits(i, rows))
        mode, out = graphs.replay(rows)
        if exchange_only:  # the engine samples outside the graph and completes the call
            sampled = out.permute(1, 0, 2).reshape(rows, -1)[:, :VOCAB].argmax(-1) \
                if mode == Mode.ALL_GATHER or rank == 0 else None
            out = path.complete(sampled)
        tokens.append(out.tolist())
        full = _logits(i, rows)
        part = full[:, rank * eager.width: (rank + 1) * eager.width]
        eager.logits_buffer(rows)[:, : part.shape[1]] = part
        eager_tokens.append(eager.run(rows_of[rows]).tolist())
    applied = [(s.seq, s.apply_call) for s in source.applied]
    return tokens, eager_tokens, [m.label for m in path.mode_log], [m.label for m in eager.mode_log], applied


@pytest.mark.parametrize("exchange_only", [False, True], ids=["whole-call", "exchange-only"])
def test_replayed_variants_switch_at_the_same_call_as_the_eager_path(exchange_only):
    results = run_ranks(_graphed_run, 2, exchange_only, timeout=150)
    for tokens, eager_tokens, modes, eager_modes, _ in results:
        assert tokens == eager_tokens
        assert modes == eager_modes == ["all_gather"] * 5 + ["gather"] * (len(STEPS) - 5)
    assert results[0][4] == [(1, 5)]  # requested at call 3, in force from call 5 (ADOPT_LAG = 2)


def _single_rank_graphs():
    from gatherwise.engine_hooks.comm import SingleRankCommunicator
    from gatherwise.engine_hooks.graphs import ModeGraphs
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.modes import Mode, ModeTable

    path = LoggedLogitsPath(SingleRankCommunicator(), VOCAB, initial_table=ModeTable.uniform(Mode.GATHER))
    path.reserve(2)
    return path, ModeGraphs(path, StandInGraphBackend())


def test_a_mode_without_a_captured_variant_is_a_clear_error_and_runs_nothing():
    from gatherwise.modes import Mode

    path, graphs = _single_rank_graphs()
    graphs.capture(Mode.ALL_GATHER, 1, lambda: (path.logits_buffer(1), path.exchange())[1])
    with pytest.raises(KeyError, match="no captured variant for mode gather with 1 rows"):
        graphs.replay(1)
    assert path.call_index == 0


def test_sharded_mode_is_refused_for_capture_and_runs_eagerly():
    """Sharded calls decide on the host (fallback rows, owners of draws): no graph variant, a clear error, and
    the same call then runs eagerly through path.run()."""
    import torch

    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow
    from gatherwise.modes import Mode, ModeTable

    path, graphs = _single_rank_graphs()
    with pytest.raises(ValueError, match="cannot be captured in a CUDA graph"):
        graphs.capture(Mode.SHARDED, 1, lambda: None)
    assert graphs.captured() == set()
    path.table = ModeTable.uniform(Mode.SHARDED)
    with pytest.raises(KeyError, match="run this call eagerly"):
        graphs.replay(1)
    path.logits_buffer(1).copy_(torch.arange(path.width, dtype=torch.float32)[None, :])
    assert path.run([SamplingRow(SamplingParams(), 0, 0)]).tolist() == [VOCAB - 1]
    assert path.mode_log[-1] == Mode.SHARDED


def test_buffers_cannot_grow_under_captured_graphs():
    from gatherwise.modes import Mode

    path, graphs = _single_rank_graphs()
    path.logits_buffer(1)
    graphs.capture(Mode.GATHER, 1, lambda: (path.logits_buffer(1), path.exchange())[1])
    with pytest.raises(RuntimeError, match="reserve"):
        path.logits_buffer(9)  # reserve(2) allocated room for 8 rows


def test_capture_asks_for_the_mode_it_captures():
    from gatherwise.modes import Mode

    path, graphs = _single_rank_graphs()
    path.logits_buffer(1)
    with pytest.raises(ValueError, match="capturing the gather variant"):
        graphs.capture(Mode.GATHER, 1, lambda: path.exchange(mode=Mode.ALL_GATHER))


def test_replayed_calls_are_timed_around_the_replay_and_nothing_is_timed_inside_the_graph(tmp_path):
    from gatherwise.engine_hooks.graphs import CAPTURABLE, ModeGraphs
    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow
    from gatherwise.modes import Mode, ModeTable
    from gatherwise.sidecar.ingest.ring_reader import RingReader
    from tests._fake_cuda import event_clock_path

    timed = event_clock_path(tmp_path / "rank-0", VOCAB, ModeTable.uniform(Mode.GATHER))
    stream, ring, resolver, path = timed.stream, timed.ring, timed.resolver, timed.path
    path.reserve(2)
    graphs = ModeGraphs(path, StandInGraphBackend())
    rows = [SamplingRow(SamplingParams(), request_id=0, position=0)]
    for mode in CAPTURABLE:
        graphs.capture(mode, 1, lambda: (path.logits_buffer(1).normal_(), path.run(rows))[1])
    assert stream.recorded == 0  # capture recorded no event: a graph must not contain the path's clock
    for _ in range(3):
        graphs.replay(1)
    stream.advance()
    resolver.poll()
    records, _ = RingReader(ring.path).read_new()
    assert [r.call_index for r in records] == [0, 1, 2] and all(r.mode == Mode.GATHER for r in records)
    # the collective mark spans the replay; sampling and the broadcast are zero-length, at its end
    assert all(r.collective_ns > 0 and r.sample_ns == 0 and r.second_ns == 0 for r in records)
    resolver.close()
