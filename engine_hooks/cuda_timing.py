"""Timing on CUDA without synchronizing: an event clock for LogitsPath and a resolver in front of the recorder.

On CUDA, perf_counter_ns around a collective measures the launch, not the work, and synchronizing to measure
it would stall the stream. So the path's clock records a CUDA event on the current stream and returns a token
(an int id, never 0: 0 means "no such mark"). The resolver receives those tokens in record(), counts the call in
the ring header at once (calls and bytes are known on the host: RingRecorder.count), keeps the call pending,
and on later calls asks the call's last event whether it has completed (event.query(), which never blocks).
Once it has, every earlier event on the stream has too: it converts the marks to ns with elapsed_time() and
hands them to the ring (RingRecorder.record_timed: the record and the time counters), a few calls late.

A device far behind the host (max_pending calls waiting) never makes the host wait: the oldest call's timings
are given up and counted as dropped (reason timing_backlog in the ring header); calls still waiting when the
recorder closes are counted as timing_at_close. Their calls and bytes were counted already, so the header's
calls and bytes counters are exact whatever the device does; only records and time counters can miss calls,
and the header says how many.

Absolute times: a call's start is the host time (perf_counter_ns) when its first event was enqueued; the
other marks are that plus GPU-measured offsets. Durations are exact GPU times; the start can be early by
however far the host runs ahead of the GPU.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.shm_format.ring import DROP_TIMING_AT_CLOSE, DROP_TIMING_BACKLOG


class Event(Protocol):
    """The part of torch.cuda.Event this module uses."""

    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end: Any) -> float: ...  # milliseconds


class SplitRecorder(Protocol):
    """The part of RingRecorder the resolver uses: count at call time, time later, count what never will be."""

    def count(self, marks: CallMarks, /) -> None: ...  # clock marks still tokens: only which are 0 counts

    def record_timed(self, marks: CallMarks, /) -> None: ...  # clock marks in ns

    def drop(self, reason: int, calls: int = 1) -> None: ...


def _timing_event() -> Event:
    import torch

    return torch.cuda.Event(enable_timing=True)


class CurrentStream:
    """torch.cuda.current_stream(), for a clock that asks several times per call. It builds a new Python Stream
    object every time (microseconds); the raw handle of the current stream is one C call, so the object is
    built once per (device, stream) and reused while that stream stays current."""

    def __init__(self) -> None:
        import torch

        self._current = torch.cuda.current_stream
        self._device = torch.cuda.current_device
        self._raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent: no caching
        self._streams: dict[tuple[int, int], Any] = {}

    def __call__(self) -> Any:
        if self._raw is None:
            return self._current()
        device = self._device()
        key = (device, self._raw(device))
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = self._current(device)
        return stream


class EventClock:
    """A LogitsPath clock: records an event on the current stream, returns its token. Events are reused."""

    marks_are_tokens = True  # its values are tokens resolved later: callers must not do arithmetic on them

    def __init__(self, event_factory: Callable[[], Event] = _timing_event,
                 host_clock: Callable[[], int] = time.perf_counter_ns,
                 current_stream: Callable[[], Any] | None = None) -> None:
        self._factory, self._host_clock = event_factory, host_clock
        self._stream = current_stream  # None: the event records on the stream it finds current itself
        self._free: list[Event] = []
        self._live: dict[int, tuple[Event, int]] = {}  # token -> (event, host ns at record), in token order
        self._next = 1

    def __call__(self) -> int:
        event = self._free.pop() if self._free else self._factory()
        event.record() if self._stream is None else event.record(self._stream())
        token = self._next
        self._next = token + 1
        self._live[token] = (event, self._host_clock())
        return token

    def entry(self, token: int) -> tuple[Event, int]:
        return self._live[token]

    def release_through(self, token: int) -> None:
        """Return the events of every token <= token to the pool (also marks of calls that never recorded)."""
        live = self._live
        while live:
            first = next(iter(live))
            if first > token:
                break
            self._free.append(live.pop(first)[0])

    @property
    def outstanding(self) -> int:
        return len(self._live)


class EventResolver:
    """A CallRecorder for an EventClock: resolves calls when their events completed, forwards ns marks."""

    def __init__(self, clock: EventClock, recorder: SplitRecorder, *, max_pending: int = 64) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.clock, self.recorder, self.max_pending = clock, recorder, max_pending
        self._pending: deque[CallMarks] = deque()  # clock marks still event tokens
        self.resolved = 0
        self.dropped = 0  # calls whose timings were given up: max_pending calls were still waiting for events
        self.dropped_at_close = 0  # calls whose events had not completed when the resolver closed

    @property
    def pending(self) -> int:
        return len(self._pending)

    def record(self, marks: CallMarks, /) -> None:
        self.recorder.count(marks)  # counted now, whatever the device does
        self._pending.append(marks.copy())  # the path refills `marks` at its next call
        self.poll()
        while len(self._pending) > self.max_pending:  # the GPU is far behind: never wait, drop the oldest
            self.clock.release_through(self._pending.popleft().t_end)
            self.dropped += 1
            self.recorder.drop(DROP_TIMING_BACKLOG)

    def poll(self) -> int:
        """Forward every leading pending call whose last event has completed; returns how many. Never blocks."""
        done = 0
        while self._pending:
            marks = self._pending[0]
            end_event, _ = self.clock.entry(marks.t_end)
            if not end_event.query():
                break
            self._pending.popleft()
            self.recorder.record_timed(marks.with_clock_marks(self._to_ns(marks.clock_marks())))
            self.clock.release_through(marks.t_end)
            done += 1
        self.resolved += done
        return done

    def _to_ns(self, tokens: tuple[int, ...]) -> list[int]:
        """Clock marks (event tokens, the first one the call's start) as host-clock ns; 0 stays 0."""
        start_event, start_ns = self.clock.entry(tokens[0])
        entry = self.clock.entry
        return [start_ns + round(start_event.elapsed_time(entry(m)[0]) * 1e6) if m else 0 for m in tokens]

    def flush(self, wait_for: Callable[[Event], None] | None = None) -> int:
        """Resolve what has completed; with wait_for (e.g. Event.synchronize, for shutdown only) wait for all."""
        if wait_for is not None and self._pending:
            wait_for(self.clock.entry(self._pending[-1].t_end)[0])
        return self.poll()

    def close(self) -> None:
        """Forward what has completed by now (never waits), count the rest as dropped, close the recorder."""
        self.poll()
        if self._pending:
            self.dropped_at_close += len(self._pending)
            self.recorder.drop(DROP_TIMING_AT_CLOSE, len(self._pending))
            self.clock.release_through(self._pending[-1].t_end)
            self._pending.clear()
        close = getattr(self.recorder, "close", None)
        if close is not None:
            close()


def cuda_recording(recorder: SplitRecorder, *, max_pending: int = 64) -> tuple[EventClock, EventResolver]:
    """The (clock, recorder) pair to pass to LogitsPath on a CUDA device: LogitsPath(clock=c, recorder=r)."""
    clock = EventClock(current_stream=CurrentStream())
    return clock, EventResolver(clock, recorder, max_pending=max_pending)
