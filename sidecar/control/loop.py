"""One daemon thread that owns the sidecar's moving state: it runs `step` at the deadlines step returns, and
runs the work other threads hand it (`call`) in between, in order.

Why one thread: the rings, the policy and the control block are read and written in a fixed order (ingest,
feed the policy, write the command), and an HTTP request that changes the policy or reads it is just one more
item in that order. No lock guards the policy: only this thread touches it. The thread sleeps until the next
deadline or until work arrives, never on a fixed tick, so an idle sidecar wakes only when something is due.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
CALL_TIMEOUT_S = 30.0  # a request waits at most this long for the loop (a poll reads a bounded batch: ms)
STEP_FAILED_RETRY_S = 0.5  # after a step raised: try again this much later, not at once in a tight loop


class Loop:
    def __init__(self, name: str, step: Callable[[], float], log: logging.Logger) -> None:
        """`step()` does what is due and returns the seconds until it is due again."""
        self.name, self.step, self.log = name, step, log
        self._work: deque[tuple[Callable[[], object], Future]] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._handoff = threading.Lock()  # orders `call` against stop(): work is never left behind unrun
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

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the loop thread and return its result (or raise its exception). Runs inline when the loop
        is not running (construction, shutdown, tests) or when called from the loop itself."""
        with self._handoff:
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                future: Future = Future()
                self._work.append((fn, future))
                self._wake.set()
        if thread is None or thread is threading.current_thread():
            return fn()
        return future.result(CALL_TIMEOUT_S)

    def _serve(self) -> None:
        while self._work:
            fn, future = self._work.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # the caller gets it (an API error becomes its HTTP status)
                    future.set_exception(exc)

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


def on_loop(method: Callable[..., T]) -> Callable[..., T]:
    """A method of an object with a `loop` (Loop) that always runs on that loop's thread."""
    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> T:
        return self.loop.call(lambda: method(self, *args, **kwargs))
    return run
