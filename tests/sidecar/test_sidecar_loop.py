"""The sidecar's one loop thread: work handed to it runs on it, in order, with results and errors returned;
a failing step never ends it; stopping it runs what was handed over."""

from __future__ import annotations

import functools
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
        def note(i: int) -> threading.Thread:
            seen.append(i)
            return threading.current_thread()

        threads = [loop.call(functools.partial(note, i)) for i in range(5)]
        assert {t.name for t in threads} == {"gw-test-loop"} and seen == [0, 1, 2, 3, 4]
        with pytest.raises(KeyError):
            # the caller gets the exception (an API error becomes its status)
            loop.call(lambda: dict[str, int]()["missing"])
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


def test_an_event_loop_awaits_handed_work_without_blocking():
    """`run` resolves on the event loop once the loop thread ran the work; meanwhile the event loop goes on."""
    import asyncio

    release = threading.Event()
    loop = Loop("gw-test-loop", lambda: 3600.0, log)
    loop.start()
    try:
        async def main() -> tuple[str, int]:
            slow = asyncio.ensure_future(loop.run(lambda: (release.wait(60), threading.current_thread().name)[1]))
            ticks = 0
            while not slow.done():  # the event loop still runs other coroutines while the work waits
                ticks += 1
                if ticks == 5:
                    release.set()
                await asyncio.sleep(0.01)
            with pytest.raises(KeyError):
                await loop.run(lambda: dict[str, int]()["missing"])
            return await slow, ticks

        name, ticks = asyncio.run(main())
        assert name == "gw-test-loop" and ticks >= 5
    finally:
        loop.stop()


def test_a_watch_answers_when_its_condition_holds_or_its_deadline_passes():
    value = {"n": 0}
    reads: list[int] = []

    def read() -> int:
        reads.append(value["n"])
        return value["n"]

    loop = Loop("gw-test-loop", lambda: 3600.0, log)
    loop.start()
    try:
        met = [loop.wait_until(read, lambda n: n >= 3, time.monotonic() + 600) for _ in range(50)]
        expired = loop.wait_until(read, lambda n: n >= 100, time.monotonic() + 0.05)
        assert expired.result(60) < 100  # its last value, at the deadline
        assert not any(f.done() for f in met)
        value["n"] = 3
        assert [f.result(60) for f in met] == [3] * 50
        # 51 watches of one read: one read per pass, not one per watch
        assert len(reads) < 51 * 3
        cancelled = loop.wait_until(read, lambda n: False, time.monotonic() + 600)
        assert cancelled.cancel()
        missing: dict[str, int] = {}
        failing = loop.wait_until(lambda: missing["missing"], lambda n: True, time.monotonic() + 600)
        with pytest.raises(KeyError):
            failing.result(60)
        pending = loop.wait_until(read, lambda n: False, time.monotonic() + 600)
    finally:
        loop.stop()
    assert pending.result(0) == 3  # stopping answers every watch with what its read says then


def test_a_watch_on_a_loop_that_is_not_running_answers_at_once():
    loop = Loop("gw-test-loop", lambda: 3600.0, log)
    assert loop.wait_until(lambda: 1, lambda n: False, time.monotonic() + 600).result(0) == 1
