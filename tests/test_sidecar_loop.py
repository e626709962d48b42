"""The sidecar's one loop thread: work handed to it runs on it, in order, with results and errors returned;
a failing step never ends it; stopping it runs what was handed over."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from gatherwise.sidecar.control.loop import Loop

log = logging.getLogger("test.loop")


def test_handed_work_runs_on_the_loop_thread_in_order():
    seen: list[int] = []
    loop = Loop("gw-test-loop", lambda: 3600.0, log)
    assert loop.call(threading.current_thread) is threading.current_thread()  # not started: inline
    loop.start()
    try:
        threads = [loop.call(lambda i=i: (seen.append(i), threading.current_thread())[1]) for i in range(5)]
        assert {t.name for t in threads} == {"gw-test-loop"} and seen == [0, 1, 2, 3, 4]
        with pytest.raises(KeyError):
            loop.call(lambda: {}["missing"])  # the caller gets the exception (an API error becomes its status)
        assert loop.call(lambda: loop.call(lambda: 7)) == 7  # from the loop itself: inline, no deadlock
    finally:
        loop.stop()


def test_a_failing_step_does_not_end_the_loop():
    steps: list[float] = []

    def step() -> float:
        steps.append(time.monotonic())
        if len(steps) == 1:
            raise RuntimeError("a ring vanished mid-read")
        return 0.01

    loop = Loop("gw-test-loop", step, log)
    loop.start()
    try:
        deadline = time.monotonic() + 60
        while len(steps) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(steps) >= 3
    finally:
        loop.stop()


def test_work_handed_over_while_stopping_still_runs():
    loop = Loop("gw-test-loop", lambda: 3600.0, log)
    loop.start()
    results = []
    callers = [threading.Thread(target=lambda i=i: results.append(loop.call(lambda: i))) for i in range(20)]
    for c in callers:
        c.start()
    loop.stop()
    for c in callers:
        c.join(60)
    assert sorted(results) == list(range(20))
