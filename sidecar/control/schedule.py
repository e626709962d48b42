"""The sidecar's schedule: poll the rings, feed the policy, follow the attached engine, step the policy, take the
live page's history points.

One thread (gatherwise.sidecar.control.loop) does it all, in this order, at the deadlines computed here: poll the rings
(batching calls: see BATCH_RECORDS; at each discovery deadline while no engine is attached), hand every joined
call to the policy (a probe ends the moment its last call arrives), follow the engine ingest reads (opening and
ending control sessions: gatherwise.sidecar.control.session_lifecycle), take a point of the logits path over time
when one is due (gatherwise.sidecar.ingest.live_history: here, not when a page asks, so a page opened late shows the
recent past), and step the policy (every STEP_INTERVAL_S while calls arrive; while none do, every IDLE_TICK_S for
probe timeouts and saves). The control API runs on the same thread (gatherwise.sidecar.control.control_api), so the
policy has one thread and no lock.
"""

from __future__ import annotations

import logging
import math
import time

from gatherwise.modes import Mode
from gatherwise.shm_format.control import ControlFormatError
from gatherwise.sidecar.control.decision_publisher import DecisionPublisher
from gatherwise.sidecar.control.loop import Loop
from gatherwise.sidecar.control.session import ControlSession
from gatherwise.sidecar.control.session_lifecycle import SessionLifecycle
from gatherwise.sidecar.control.session_store import SessionStore
from gatherwise.sidecar.ingest.attached_engine import AttachedEngine
from gatherwise.sidecar.ingest.joined_call import JoinedCall
from gatherwise.sidecar.ingest.live_history import LiveHistory
from gatherwise.sidecar.ingest.poll import Ingest

log = logging.getLogger("gatherwise.sidecar.control")
# While calls flow the policy steps this often (its decisions are paced in seconds; a probe ends as its last call
# is fed); without new calls, once a second (probe timeouts are >= 2 s, saves >= 1 s). A step looks at every
# bucket x mode: 20 steps a second cost an auto sidecar ~0.6 % of a core at 100 calls/s (docs/BENCHMARKS.md,
# "Sidecar CPU").
STEP_INTERVAL_S = 0.2
IDLE_TICK_S = 1.0
# Polls batch calls: the next poll comes when about BATCH_RECORDS new records per rank (a quarter of the ring at
# most) are due at the rate the last poll saw, within [sidecar.poll_interval_seconds, MAX_POLL_WAIT_S] (how late
# metrics and traces may be; records join from when they are read, so a call straddling two polls still joins);
# while a probe runs, when the calls it still needs are due (the policy waits on them). Each wakeup of a Python
# thread costs tens to hundreds of µs on a loaded host: 50 polls a second were most of the sidecar's CPU at 100
# calls/s; batched, they are a handful.
BATCH_RECORDS = 32
MAX_POLL_WAIT_S = 0.25
# An engine without a control block (control disabled, or rank 0 still starting) is looked at again this often.
ATTACH_RETRY_S = 0.5


class SidecarSchedule:
    def __init__(self, ingest: Ingest, sessions: SessionLifecycle, publisher: DecisionPublisher, store: SessionStore,
                 history: LiveHistory, *, poll_interval: float) -> None:
        self.ingest, self.sessions, self.publisher, self.store = ingest, sessions, publisher, store
        self.history = history
        self.poll_interval = poll_interval
        self.step_interval = max(poll_interval, STEP_INTERVAL_S)
        self.loop = Loop("gatherwise-sidecar", self._step, log)
        self._next_poll = self._next_attach = self._last_tick = self._polled_at = self._next_point = 0.0
        self._called = False  # calls fed to the policy since its last step

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.loop.stop(timeout)
        if self.sessions.current is not None:
            self.store.save(self.sessions.current)

    def _step(self) -> float:
        """Whatever is due now, in order; returns the seconds until the next deadline."""
        now = time.monotonic()
        sessions = self.sessions
        if now >= self._next_poll:
            poll = self.ingest.poll_once()
            self._feed(poll.calls)
            if poll.engine is not None:
                self._next_poll = now + self._poll_wait(poll.engine, poll.records, now)
            else:  # nothing to read until discovery finds an engine
                self._next_poll = now + poll.seconds_to_discovery
            controlled = sessions.current.engine if sessions.current is not None else None
            if poll.engine is not controlled and now >= self._next_attach:
                self._next_attach = now + ATTACH_RETRY_S
                sessions.follow(poll.engine)
        next_point = self._history(now)
        session = sessions.current
        if session is None:
            return min(self._next_poll, next_point) - time.monotonic()
        tick_at = self._last_tick + (self.step_interval if self._called else IDLE_TICK_S)
        if now >= tick_at:
            self._tick(session, now)
            self._last_tick, tick_at = now, now + IDLE_TICK_S
            if sessions.current is not None and sessions.current.policy.probe is not None:  # it waits on its calls
                self._next_poll = min(self._next_poll, now + self.poll_interval)
        return min(self._next_poll, tick_at, next_point) - time.monotonic()

    def _history(self, now: float) -> float:
        """Take a history point when one is due, after the poll (so it holds the newest calls); returns when the
        next is due, never while no engine is attached (an idle sidecar wakes for nothing)."""
        if self.ingest.engine is None:
            return math.inf
        if now >= self._next_point:
            self._next_point = now + self.history.take()
        return self._next_point

    def _poll_wait(self, eng: AttachedEngine, read: int, now: float) -> float:
        """Seconds until the next poll of the attached engine, after one that read `read` records."""
        elapsed, self._polled_at = now - self._polled_at, now
        base = self.poll_interval
        per_rank = read / len(eng.readers)
        if per_rank <= 0:  # quiet rings
            return max(base, MAX_POLL_WAIT_S)
        batch = min(BATCH_RECORDS, max(1, eng.readers[0].capacity // 4))
        session = self.sessions.current
        probe = session.policy.probe if session is not None else None
        if session is not None and probe is not None:
            # the calls the probe still needs, at most: its end is seen soon after it comes
            batch = min(batch, max(1, session.policy.params.probe_calls - probe.calls))
        return min(max(elapsed * batch / per_rank, base), max(base, MAX_POLL_WAIT_S))

    def _tick(self, session: ControlSession, now: float) -> None:
        self._called = False
        if session.read_only:  # no policy here; take over once the owner is gone
            self.sessions.take_over_if_free(session)
            return
        try:
            self.publisher.publish(session, session.policy.step(now))
        except ControlFormatError as exc:
            self.sessions.give_up(session, exc)
            return
        self.store.save_if_due(session, now)

    def _feed(self, calls: list[JoinedCall]) -> None:
        """The policy's input: each joined call of the controlled engine, once, in order."""
        for call in calls:
            session = self.sessions.current
            if session is None or session.read_only or call.engine is not session.engine \
                    or call.call_index <= session.last_call_index:
                continue
            session.last_call_index = call.call_index
            policy = session.policy
            costed = session.costs.charge(call, policy.params.cost)
            if costed is None:
                continue
            learned, seconds = costed
            if learned.mode not in policy.modes:  # a mode code this sidecar does not choose among: nothing to learn
                continue
            now = time.monotonic()
            session.dirty = self._called = True
            if policy.observe(Mode(learned.mode), learned.bucket, seconds, now, learned.tag):
                # the running probe has its calls: end it now, not at the next step, so it costs no extra calls
                try:
                    self.publisher.publish(session, policy.step(now))
                except ControlFormatError as exc:
                    self.sessions.give_up(session, exc)
