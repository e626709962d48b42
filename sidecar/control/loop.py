"""One daemon thread that owns the sidecar's moving state: it runs `step` at the deadlines step returns, and
runs the work other threads hand it in between, in order.

Why one thread: the rings, the policy and the control block are read and written in a fixed order (ingest,
feed the policy, write the command), and an HTTP request that changes the policy or reads it is just one more
item in that order. No lock guards the policy: only this thread touches it. The thread sleeps until the next
deadline or until work arrives, never on a fixed tick, so an idle sidecar wakes only when something is due.

The one threading rule: the moving state (the attached engine and what ingest made of its rings, the histograms,
the policy, the control sessions and block) is read and written on this thread only. Every other thread hands its
work over: an HTTP handler awaits `run` (or an `on_loop` method) and its event loop goes on serving meanwhile; a
/metrics scrape hands over the whole exposition, so every collector reads on this thread too; a request that
waits for something to happen (rank 0 applying a command) is a watch (`wait_until`) this thread answers. `call`
blocks its caller until the work ran: for threads that may block (tests, tools), never an event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")
CALL_TIMEOUT_S = 30.0  # a request waits at most this long for the loop (a poll reads a bounded batch: ms)
STEP_FAILED_RETRY_S = 0.5  # after a step raised: try again this much later, not at once in a tight loop
# While a watch waits, its read repeats this often (a waiting PUT /v1/mode answers within about this much of rank
# 0 applying its command); one read per interval serves every watch that reads the same thing.
WATCH_INTERVAL_S = 0.01


@dataclass
class _Watch:
    read: Callable[[], Any]
    done: Callable[[Any], bool]
    deadline: float  # time.monotonic()
    future: Future


class Loop:
    def __init__(self, name: str, step: Callable[[], float], log: logging.Logger) -> None:
        """`step()` does what is due and returns the seconds until it is due again."""
        self.name, self.step, self.log = name, step, log
        self._work: deque[tuple[Callable[[], object], Future]] = deque()
        self._new_watches: deque[_Watch] = deque()
        self._watches: list[_Watch] = []  # only the loop thread (or stop(), once it has ended) touches these
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._handoff = threading.Lock()  # orders hand-overs against stop(): work is never left behind unrun
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)  # until it has ended, work handed over is queued, never run beside it
        with self._handoff:
            self._thread = None
        self._serve()  # work handed over while the thread was ending runs here, on the only thread left
        self._check_watches(final=True)  # and every watch is answered with what its read says now

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Hand fn to the loop thread; the future holds its result (or its exception). Runs inline (the future
        is done on return) when the loop is not running (construction, shutdown, tests) or from the loop itself."""
        future: Future[T] = Future()
        with self._handoff:
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                self._work.append((fn, future))
                self._wake.set()
                return future
        future.set_running_or_notify_cancel()
        _settle(future, fn)
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the loop thread and wait for its result, blocking the calling thread: for threads that may
        block (tests, tools). An event loop awaits `run` instead."""
        return self.submit(fn).result(CALL_TIMEOUT_S)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run fn on the loop thread; the awaiting coroutine resumes once it ran (the loop thread resolves the
        future, and asyncio.wrap_future hands the result to the event loop with call_soon_threadsafe): the
        event loop never blocks, and no thread of its pool waits."""
        return await asyncio.wait_for(asyncio.wrap_future(self.submit(fn)), CALL_TIMEOUT_S)

    def wait_until(self, read: Callable[[], T], done: Callable[[T], bool], deadline: float) -> Future[T]:
        """A future of read()'s value once done(value) holds, or of its last value at `deadline` (monotonic
        seconds), or of its exception. The loop thread reads every WATCH_INTERVAL_S while any watch waits;
        watches with an equal `read` share one call per pass. A cancelled future's watch is dropped. Not
        running: one read, now."""
        watch = _Watch(read, done, deadline, Future())
        with self._handoff:
            running = self._thread is not None
            if running:
                self._new_watches.append(watch)
                self._wake.set()
        if not running:
            self._answer([watch], final=True)
        return watch.future

    def _serve(self) -> None:
        while self._work:
            fn, future = self._work.popleft()
            if future.set_running_or_notify_cancel():
                _settle(future, fn)

    def _check_watches(self, final: bool = False) -> float:
        """Answer the watches that are done (all of them when `final`); returns the seconds until the next pass."""
        while self._new_watches:
            self._watches.append(self._new_watches.popleft())
        if not self._watches:
            return math.inf
        self._watches = self._answer(self._watches, final)
        if not self._watches:
            return math.inf
        now = time.monotonic()
        return max(0.0, min(WATCH_INTERVAL_S, min(w.deadline for w in self._watches) - now))

    @staticmethod
    def _answer(watches: list[_Watch], final: bool) -> list[_Watch]:
        """Read once per distinct `read`, resolve what is due; returns the watches still waiting."""
        now = time.monotonic()
        outcomes: dict[Callable[[], Any], tuple[bool, Any]] = {}
        waiting = []
        for w in watches:
            if w.future.cancelled():
                continue
            outcome = outcomes.get(w.read)
            if outcome is None:
                try:
                    outcome = outcomes[w.read] = (True, w.read())
                except Exception as exc:  # the waiter gets it (an API error becomes its HTTP status)
                    outcome = outcomes[w.read] = (False, exc)
            ok, value = outcome
            try:
                if not ok:
                    w.future.set_exception(value)
                elif final or now >= w.deadline or w.done(value):
                    w.future.set_result(value)
                else:
                    waiting.append(w)
            except InvalidStateError:  # cancelled by its waiter meanwhile
                pass
        return waiting

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.is_set():
            self._wake.wait(delay)
            self._wake.clear()  # before serving: work handed over from now on wakes the next wait
            self._serve()
            try:
                delay = max(0.0, self.step())
            except Exception:  # one bad step (a ring or block vanishing mid-read) must not end the loop
                self.log.exception("%s step failed", self.name)
                delay = STEP_FAILED_RETRY_S
            delay = min(delay, self._check_watches())


def _settle(future: Future[T], fn: Callable[[], T]) -> None:
    try:
        future.set_result(fn())
    except BaseException as exc:  # the caller gets it (an API error becomes its HTTP status)
        future.set_exception(exc)


def on_loop(method: Callable[Concatenate[S, P], T]) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """A method of an object with a `loop` (Loop) that runs on that loop's thread; callers await it."""
    @functools.wraps(method)
    async def run(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        loop: Loop = self.loop  # type: ignore[attr-defined]
        return await loop.run(functools.partial(method, self, *args, **kwargs))
    return run
