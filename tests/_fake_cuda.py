"""A stand-in for CUDA events on the CPU, for the tests of the CUDA timing design: a GPU stream that lags until
the test lets it advance, events that complete in order, and a single-rank logits path timed by them into a real
ring (torch.cuda is never touched)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gatherwise.engine_hooks.comm import SingleRankCommunicator
from gatherwise.engine_hooks.cuda_timing import EventClock, EventResolver
from gatherwise.engine_hooks.logits_path import LogitsPath
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.modes import ModeTable


class FakeGpuStream:
    """A stream whose work completes only when the test says so: events complete in the order recorded."""

    def __init__(self) -> None:
        self.recorded = 0  # events enqueued so far
        self.completed = 0  # events the fake GPU has reached
        self.gpu_ms: dict[int, float] = {}  # position -> GPU timestamp (ms) assigned when recorded

    def advance(self, n: int | None = None) -> None:
        self.completed = self.recorded if n is None else min(self.recorded, self.completed + n)


class FakeCudaEvent:
    """Stands in for torch.cuda.Event(enable_timing=True): record(), query(), elapsed_time() in ms."""

    def __init__(self, stream: FakeGpuStream) -> None:
        self.stream = stream
        self.position: int | None = None  # in the stream's order, once recorded
        self.queries = 0
        self.synchronize_calls = 0

    def record(self, stream: object = None) -> None:
        """torch.cuda.Event.record(stream=None); the fake has one stream, its own, whatever `stream` is."""
        self.stream.recorded += 1
        self.position = self.stream.recorded
        self.stream.gpu_ms[self.position] = 0.25 * self.position  # 250 µs of GPU time between events

    def _recorded_at(self) -> int:
        if self.position is None:
            raise RuntimeError("the event was never recorded")
        return self.position

    def query(self) -> bool:
        self.queries += 1
        return self.stream.completed >= self._recorded_at()

    def elapsed_time(self, end: FakeCudaEvent) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("elapsed_time on an event that has not completed")
        return self.stream.gpu_ms[end._recorded_at()] - self.stream.gpu_ms[self._recorded_at()]

    def synchronize(self) -> None:
        self.synchronize_calls += 1
        self.stream.completed = max(self.stream.completed, self._recorded_at())


@dataclass
class EventClockPath:
    """A single-rank LogitsPath whose clock is fake CUDA events, resolved into a real ring."""

    stream: FakeGpuStream
    ring: RingRecorder
    resolver: EventResolver
    path: LogitsPath


def event_clock_path(ring_file: Path, vocab: int, table: ModeTable, capacity: int = 16) -> EventClockPath:
    stream = FakeGpuStream()
    clock = EventClock(lambda: FakeCudaEvent(stream))
    ring = RingRecorder(ring_file, engine_id=1, rank=0, tp_size=1, vocab=vocab, dtype="float32", capacity=capacity)
    resolver = EventResolver(clock, ring)
    path = LogitsPath(SingleRankCommunicator(), vocab, initial_table=table, recorder=resolver, clock=clock)
    return EventClockPath(stream, ring, resolver, path)
