"""The ring recorder behind the real LogitsPath: one record per call on every rank, counters that match."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import torch

from gatherwise.call_kind import Sampling, call_kind, split_tag
from gatherwise.modes import Mode
from gatherwise.shm_format import ring as fmt
from gatherwise.sidecar.ingest.ring_reader import RingReader
from tests._dist import run_ranks

if TYPE_CHECKING:
    from gatherwise.engine_hooks.sampling import SamplingRow

VOCAB = 1001
BATCHES = [1, 4, 2, 1, 3, 8]  # rows 1 -> all_gather, more -> gather (table below)


TOP_P_STEPS = (1, 3)  # one row of these calls samples with top-p: the call's kind is top_p


def _rows(step: int, batch: int) -> list[SamplingRow]:
    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow

    top_p = SamplingParams(temperature=0.8, top_p=0.9)
    return [SamplingRow(top_p if step in TOP_P_STEPS and i == 0 else SamplingParams(), request_id=i, position=step)
            for i in range(batch)]


def _table():
    from gatherwise.modes import ModeTable

    return ModeTable.uniform(Mode.GATHER).with_buckets(Mode.ALL_GATHER, [0])


def _run_recorded(rank, world, shm_dir, engine_id):
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.logits_path import LogitsPath
    from gatherwise.engine_hooks.recorder import RingRecorder

    recorder = RingRecorder(fmt.ring_path(shm_dir, engine_id, rank), engine_id=engine_id, rank=rank, tp_size=world,
                            vocab=VOCAB, dtype=torch.float32, capacity=64)
    path = LogitsPath(default_communicator(), VOCAB, initial_table=_table(), recorder=recorder)
    gen = torch.Generator().manual_seed(3)
    for step, batch in enumerate(BATCHES):
        full = torch.randn(batch, VOCAB, generator=gen)
        buf = path.logits_buffer(batch)
        part = full[:, rank * path.width: (rank + 1) * path.width]
        buf[:, : part.shape[1]] = part
        path.run(_rows(step, batch))
    recorder.close()
    return path.width


@pytest.mark.timeout(180)
def test_every_rank_records_every_call_with_exact_counters(tmp_path):
    engine_id = 0x0123456789ABCDEF
    os.makedirs(fmt.engine_dir(tmp_path, engine_id))
    width = run_ranks(_run_recorded, 2, str(tmp_path), engine_id, timeout=150)[0]
    for rank in (0, 1):
        reader = RingReader(fmt.ring_path(tmp_path, engine_id, rank))
        records, missed = reader.read_new()
        h = reader.header()
        assert missed == 0 and h.closed and (h.engine_id, h.rank, h.tp_size) == (engine_id, rank, 2)
        assert [r.call_index for r in records] == list(range(len(BATCHES)))
        assert [r.rows for r in records] == BATCHES
        modes = [Mode.ALL_GATHER if b == 1 else Mode.GATHER for b in BATCHES]
        assert [r.mode for r in records] == modes
        kinds = [call_kind(Sampling.TOP_P if step in TOP_P_STEPS else Sampling.GREEDY) for step in range(len(BATCHES))]
        assert [split_tag(r.tag) for r in records] == [(k, int(m)) for k, m in zip(kinds, modes, strict=True)]
        for r in records:
            assert r.start_ns <= r.collective_start_ns <= r.collective_start_ns + r.collective_ns <= r.end_ns
            chunk_bytes = (r.rows * width + 2) * 4  # shard + one 8-byte control word slot, float32
            if r.mode == Mode.ALL_GATHER:
                assert r.second_start_ns == r.second_ns == 0 and r.nbytes == 2 * chunk_bytes
            else:
                assert r.second_start_ns >= r.sample_start_ns + r.sample_ns
                assert r.nbytes == (2 * chunk_bytes if rank == 0 else chunk_bytes)
                if rank == 1:
                    assert r.sample_ns == 0  # only the root samples in gather mode
        for mode in (Mode.ALL_GATHER, Mode.GATHER):
            mine = [r for r in records if r.mode == mode]
            row = h.counters[mode]
            coll = "all_gather" if mode == Mode.ALL_GATHER else "gather"
            assert row.calls == len(mine)
            assert row.ops[coll] == fmt.OpCounters(sum(r.collective_ns for r in mine), sum(r.nbytes for r in mine))
            assert row.ops["sample"].ns == sum(r.sample_ns for r in mine)
            assert row.ops["path"].ns == sum(r.path_ns for r in mine)
            bcast = sum(fmt.broadcast_bytes(r.rows) for r in mine) if mode == Mode.GATHER else 0
            assert row.ops["broadcast"] == fmt.OpCounters(sum(r.second_ns for r in mine), bcast)
            assert row.ops["path"].bytes == row.ops[coll].bytes + bcast


def test_event_clock_through_the_real_path_into_a_ring(tmp_path):
    """LogitsPath with the CUDA clock design (fake events on CPU): tokens flow through, records land in the ring."""
    from tests._fake_cuda import event_clock_path

    timed = event_clock_path(tmp_path / "rank-0", VOCAB, _table())
    stream, recorder, resolver, path = timed.stream, timed.ring, timed.resolver, timed.path
    for step, batch in enumerate(BATCHES):
        path.logits_buffer(batch).normal_()
        path.run(_rows(step, batch))
    reader = RingReader(recorder.path)
    assert reader.read_new() == ([], 0)  # nothing completed on the fake GPU yet
    stream.advance()
    resolver.poll()
    records, missed = reader.read_new()
    assert missed == 0 and [r.rows for r in records] == BATCHES
    step = 250_000  # the fake GPU's 0.25 ms between events
    assert all(r.collective_ns == step and r.path_ns % step == 0 for r in records)
    assert [r.second_ns for r in records] == [0 if b == 1 else step for b in BATCHES]
    resolver.close()
    assert reader.header().closed


def test_event_clock_marks_of_a_sharded_call_are_its_own_events(tmp_path):
    """Sharded calls through the event clock (fake events on CPU): every mark of a record is an event of that
    call, in order — never a token computed from other tokens — greedy (one collective) and temperature (two)."""
    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow
    from gatherwise.modes import ModeTable
    from tests._fake_cuda import event_clock_path

    timed = event_clock_path(tmp_path / "rank-0", VOCAB, ModeTable.uniform(Mode.SHARDED))
    stream, recorder, resolver, path = timed.stream, timed.ring, timed.resolver, timed.path
    kinds = [SamplingParams(), SamplingParams(temperature=0.7, seed=5)]
    for step in range(4):
        path.logits_buffer(3).normal_()
        path.run([SamplingRow(kinds[step % 2], request_id=i, position=step) for i in range(3)])
    stream.advance()
    resolver.poll()
    records, missed = RingReader(recorder.path).read_new()
    step_ns = 250_000  # the fake GPU's time between consecutive events
    assert missed == 0 and [r.mode for r in records] == [int(Mode.SHARDED)] * 4
    for i, r in enumerate(records):
        assert r.sample_start_ns > r.start_ns and r.sample_ns > 0 and r.sample_ns % step_ns == 0
        assert r.sample_start_ns + r.sample_ns == r.collective_start_ns  # the shard summaries end the sample span
        assert r.collective_ns > 0 and r.collective_ns % step_ns == 0
        assert (r.second_ns > 0) == (i % 2 == 1)  # temperature calls run shard_resolve
    resolver.close()


def _run_lagging_device(rank, world, shm_dir, engine_ids):
    """The same calls twice on real gloo ranks: once timed on the CPU clock, once through the CUDA timing design
    with a stand-in device that falls far behind (tests._fake_cuda's fake events)."""
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.cuda_timing import EventClock, EventResolver
    from gatherwise.engine_hooks.logits_path import LogitsPath
    from gatherwise.engine_hooks.recorder import RingRecorder
    from tests._fake_cuda import FakeCudaEvent, FakeGpuStream

    _plain_id, _lagging_id = engine_ids
    stream = FakeGpuStream()
    clock = EventClock(lambda: FakeCudaEvent(stream))
    recorders = [RingRecorder(fmt.ring_path(shm_dir, e, rank), engine_id=e, rank=rank, tp_size=world, vocab=VOCAB,
                              dtype=torch.float32, capacity=64) for e in engine_ids]
    resolver = EventResolver(clock, recorders[1], max_pending=3)
    paths = [LogitsPath(default_communicator(), VOCAB, initial_table=_table(), recorder=recorders[0]),
             LogitsPath(default_communicator(), VOCAB, initial_table=_table(), recorder=resolver, clock=clock)]
    gen = torch.Generator().manual_seed(3)
    for step, batch in enumerate(BATCHES * 3):
        full = torch.randn(batch, VOCAB, generator=gen)
        for path in paths:
            part = full[:, rank * path.width: (rank + 1) * path.width]
            path.logits_buffer(batch)[:, : part.shape[1]] = part
            path.run(_rows(step, batch))
        if step == 9:
            stream.advance()  # the device catches up once: the 3 calls still pending resolve
    recorders[0].close()
    resolver.close()  # 3 calls still waiting for the device: counted as dropped at close
    return resolver.resolved, resolver.dropped, resolver.dropped_at_close


@pytest.mark.timeout(180)
def test_counters_stay_exact_when_the_device_falls_behind(tmp_path):
    plain_id, lagging_id = 0x21, 0x22
    for engine_id in (plain_id, lagging_id):
        os.makedirs(fmt.engine_dir(tmp_path, engine_id))
    results = run_ranks(_run_lagging_device, 2, str(tmp_path), (plain_id, lagging_id), timeout=150)
    calls = len(BATCHES) * 3
    for rank, (resolved, dropped, at_close) in enumerate(results):
        assert (resolved, dropped, at_close) == (3, calls - 6, 3)
        with RingReader(fmt.ring_path(tmp_path, plain_id, rank)) as plain, \
                RingReader(fmt.ring_path(tmp_path, lagging_id, rank)) as lagging:
            p, lg = plain.header(), lagging.header()
            # every call counted with its bytes, although only 3 of 18 ever got timings
            for mode in (Mode.ALL_GATHER, Mode.GATHER):
                assert lg.counters[mode].calls == p.counters[mode].calls > 0
                assert {op: c.bytes for op, c in lg.counters[mode].ops.items()} == \
                    {op: c.bytes for op, c in p.counters[mode].ops.items()}
            assert p.drops == {"timing_backlog": 0, "timing_at_close": 0}
            assert lg.drops == {"timing_backlog": dropped, "timing_at_close": at_close}
            assert lg.write_index + dropped + at_close == calls == p.write_index
            records, _ = lagging.read_new()
            assert [r.call_index for r in records] == [7, 8, 9]  # the three pending when the device caught up
            for mode in (Mode.ALL_GATHER, Mode.GATHER):  # time counters hold exactly the timed calls
                mine = [r for r in records if r.mode == mode]
                assert lg.counters[mode].ops["path"].ns == sum(r.path_ns for r in mine)
