"""The CUDA event clock and resolver, driven on CPU by a fake event class that simulates a lagging GPU stream."""

from __future__ import annotations

from dataclasses import astuple

import pytest

from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.cuda_timing import EventClock, EventResolver
from gatherwise.modes import Mode
from gatherwise.shm_format import ring as fmt
from tests._fake_cuda import FakeCudaEvent, FakeGpuStream


class ListRecorder:
    """Keeps what the resolver hands a RingRecorder (the real one is exercised in test_recorder_path.py)."""

    def __init__(self) -> None:
        self.calls: list[CallMarks] = []  # what record_timed() received
        self.counted: list[CallMarks] = []
        self.drops: dict[int, int] = {}
        self.closed = False

    def count(self, marks: CallMarks, /) -> None:
        self.counted.append(marks)

    def record_timed(self, marks: CallMarks, /) -> None:
        self.calls.append(marks)

    def drop(self, reason: int, calls: int = 1) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + calls

    def close(self) -> None:
        self.closed = True


def make(max_pending=64):
    stream = FakeGpuStream()
    created: list[FakeCudaEvent] = []

    def factory() -> FakeCudaEvent:
        created.append(FakeCudaEvent(stream))
        return created[-1]

    host = iter(range(1_000_000, 10**12, 7))
    clock = EventClock(factory, host_clock=lambda: next(host))
    sink = ListRecorder()
    return stream, created, clock, EventResolver(clock, sink, max_pending=max_pending), sink


def run_call(clock, resolver, i, mode):
    """What LogitsPath.run does with its clock: same marks, same reuse of tokens."""
    t_start = clock()
    coll_start = clock()
    coll_end = sample_start = clock()
    if mode == Mode.ALL_GATHER:
        sample_end = clock()
        bcast_start = bcast_end = 0
    else:
        sample_end = bcast_start = clock()
        bcast_end = clock()
    t_end = clock()
    resolver.record(CallMarks(i, mode, 4, 0, 1000, t_start, coll_start, coll_end, bcast_start, bcast_end,
                              sample_start, sample_end, t_end))


def test_calls_resolve_only_after_their_events_complete_and_in_order():
    stream, _, clock, resolver, sink = make()
    run_call(clock, resolver, 0, Mode.ALL_GATHER)
    run_call(clock, resolver, 1, Mode.GATHER)
    assert sink.calls == [] and resolver.pending == 2  # the fake GPU has done nothing yet
    stream.advance(5)  # exactly call 0's five events
    run_call(clock, resolver, 2, Mode.ALL_GATHER)
    assert [c.call_index for c in sink.calls] == [0] and resolver.pending == 2
    stream.advance()
    assert resolver.poll() == 2
    assert [c.call_index for c in sink.calls] == [0, 1, 2] and resolver.pending == 0


def one_resolved_call(mode: Mode) -> CallMarks:
    """What the resolver hands the recorder for one call in `mode` once the fake GPU ran it."""
    stream, _, clock, resolver, sink = make()
    run_call(clock, resolver, 0, mode)
    stream.advance()
    resolver.poll()
    (call,) = sink.calls
    return call


def test_marks_become_ns_from_gpu_time_anchored_at_host_start():
    call = one_resolved_call(Mode.GATHER)
    call_index, mode, rows, epoch, nbytes, t_start, cs, ce, bs, be, ss, se, t_end, *optional = astuple(call)
    assert optional == [0, 0, 0, 0]
    assert (call_index, mode, rows, epoch, nbytes) == (0, Mode.GATHER, 4, 0, 1000)
    assert t_start == 1_000_000  # host time when the first event was enqueued
    step = 250_000  # 0.25 ms between consecutive fake events
    assert (cs, ce, ss, se, bs, be, t_end) == tuple(t_start + k * step for k in (1, 2, 2, 3, 3, 4, 5))


def test_absent_marks_stay_zero():
    call = one_resolved_call(Mode.ALL_GATHER)
    assert (call.second_start, call.second_end) == (0, 0)  # no broadcast in all_gather mode


def test_never_synchronizes_and_reuses_events():
    stream, created, clock, resolver, sink = make()
    for i in range(200):
        run_call(clock, resolver, i, Mode.GATHER if i % 2 else Mode.ALL_GATHER)
        stream.advance()  # the GPU keeps up: each call resolves on the next
    resolver.flush()
    assert len(sink.calls) == 200 and resolver.dropped == 0
    assert all(e.synchronize_calls == 0 for e in created)
    assert len(created) <= 12  # a bounded pool, not one event per mark
    assert clock.outstanding == 0


def test_a_far_behind_gpu_drops_the_oldest_calls_instead_of_waiting():
    stream, created, clock, resolver, sink = make(max_pending=8)
    for i in range(20):
        run_call(clock, resolver, i, Mode.ALL_GATHER)
    assert resolver.pending == 8 and resolver.dropped == 12 and sink.calls == []
    assert len(sink.counted) == 20  # every call counted at once, timed or not
    assert sink.drops == {fmt.DROP_TIMING_BACKLOG: 12}
    assert all(e.synchronize_calls == 0 for e in created)
    stream.advance()
    resolver.poll()
    assert [c.call_index for c in sink.calls] == list(range(12, 20))
    assert clock.outstanding == 0


def test_marks_of_a_call_that_never_recorded_are_released():
    stream, _, clock, resolver, sink = make()
    clock(), clock()  # a call that raised before record()
    run_call(clock, resolver, 1, Mode.ALL_GATHER)
    stream.advance()
    resolver.poll()
    assert len(sink.calls) == 1 and clock.outstanding == 0


def test_flush_with_wait_is_explicit_and_close_forwards_what_completed():
    _stream, _created, clock, resolver, sink = make()
    run_call(clock, resolver, 0, Mode.ALL_GATHER)
    assert resolver.flush(wait_for=FakeCudaEvent.synchronize) == 1
    run_call(clock, resolver, 1, Mode.ALL_GATHER)
    resolver.close()
    assert sink.closed and len(sink.calls) == 1  # close never waits for the GPU
    assert len(sink.counted) == 2 and sink.drops == {fmt.DROP_TIMING_AT_CLOSE: 1}  # ... and says what it left
    assert clock.outstanding == 0


def test_max_pending_must_be_positive():
    with pytest.raises(ValueError):
        EventResolver(EventClock(), ListRecorder(), max_pending=0)
