"""What the /v1 routes and the control gauges ask of the sidecar. Each public method runs on the sidecar's loop
thread (gatherwise.sidecar.control.loop: the one threading rule) and returns values copied there (PolicyView,
PolicyStats, decisions), so the policy has one thread and no lock: the routes await them (`on_loop`), the
control gauges' `control_view` runs inside the exposition, which the /metrics route hands to the loop thread.

What the engine runs is read from the control block (status area), never assumed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gatherwise.config import PolicyParams
from gatherwise.modes import NUM_BUCKETS, Mode, ModeTable, bucket_label
from gatherwise.shm_format.control import ControlFormatError, seq_is_newer, seq_reached
from gatherwise.sidecar.control.block_client import AreaMidWriteError, ControlSnapshot, InvalidTableWordError
from gatherwise.sidecar.control.decision_publisher import REQUEST_REASONS, DecisionPublisher
from gatherwise.sidecar.control.loop import Loop, on_loop
from gatherwise.sidecar.control.role import Role, has_control_block, observer_reason
from gatherwise.sidecar.control.session import ControlSession
from gatherwise.sidecar.control.session_lifecycle import SessionLifecycle
from gatherwise.sidecar.control.session_store import SessionStore
from gatherwise.sidecar.ingest.attached_engine import AttachedEngine
from gatherwise.sidecar.metrics.control_gauges import ControlView
from gatherwise.sidecar.policy.decision_log import Decision
from gatherwise.sidecar.policy.estimates import Estimate
from gatherwise.sidecar.policy.mode_policy import ModePolicy

log = logging.getLogger("gatherwise.sidecar.control")
# Distinct unreadable table words warned about (a block written over and over must not flood the log).
MAX_WORD_WARNINGS = 16


class NotAttached(RuntimeError):
    """No engine with a control block is attached."""


class ReadOnly(NotAttached):
    """Another sidecar holds the attached engine's control lock: this one only shows the engine."""


class Observing(NotAttached):
    """The attached engine's control block is not in this sidecar's directory (another node's, or none): this
    sidecar observes it (gatherwise.sidecar.control.role)."""


@dataclass(frozen=True)
class PolicyView:
    """The attached engine's policy as the API shows it, copied on the loop thread."""

    engine: str | None  # engine label; None when no engine is attached
    policy: str | None  # manual | auto | mixed
    pinned: dict[str, str]  # bucket label -> mode label
    params: PolicyParams
    read_only: bool = False  # another sidecar controls the engine


@dataclass(frozen=True)
class BucketModeEstimate:
    """The policy's estimate of one bucket x mode (GET /v1/stats: gatherwise.sidecar.api.control_models)."""

    bucket: str
    mode: str
    samples: int
    mean_seconds: float
    p50_seconds: float
    p90_seconds: float
    age_seconds: float


@dataclass(frozen=True)
class PolicyStats:
    """What the attached engine's policy has seen and estimated, copied on the loop thread."""

    engine: str | None
    stats: list[BucketModeEstimate]
    calls_observed: int
    probe_calls: int
    probe_share: float
    probe_cost_share: float = 0.0


def api_token(configured: str | None, env: Mapping[str, str]) -> str | None:
    """The bearer token mutations need (sidecar.api_token, else GATHERWISE_API_TOKEN); None: mutations refused."""
    return configured or env.get("GATHERWISE_API_TOKEN") or None


class ControlApi:
    def __init__(self, sessions: SessionLifecycle, publisher: DecisionPublisher, store: SessionStore, loop: Loop, *,
                 api_token: str | None, shm_dir: str, attached: Callable[[], AttachedEngine | None]) -> None:
        """`attached`: the engine ingest reads now (gatherwise.sidecar.ingest.poll.Ingest.engine), which an
        observer has and controls no session of."""
        self.sessions, self.publisher, self.store, self.loop = sessions, publisher, store, loop
        self.api_token, self.shm_dir, self.attached = api_token, shm_dir, attached
        self._unreadable_words: set[str] = set()  # messages of table words already warned about

    def attached_role(self) -> tuple[str, Role] | None:
        """(engine label, this sidecar's role for it), None while no engine is attached. On the loop thread (the
        readiness route and the role gauge run there)."""
        eng = self.attached()
        if eng is None:
            return None
        session = self.sessions.current
        if session is not None and session.engine is eng:
            return eng.label, "observer" if session.read_only else "controller"
        return eng.label, "observer"  # a controller is one that opened and verified the block: a session

    def _observed_only(self) -> AttachedEngine | None:
        """The attached engine, when its control block is not in this sidecar's directory."""
        eng = self.attached()
        session = self.sessions.current
        if eng is None or (session is not None and session.engine is eng) or has_control_block(eng):
            return None
        return eng

    @on_loop
    def mutation_refusal(self) -> str | None:
        """Why no mutation can succeed on this sidecar whatever its token, else None: its directory has no control
        block of the attached engine (another node's sidecar controls it, or nobody can). The mutating routes
        answer 409 with it before they look at the token. (A sidecar beside the controller on the same node is
        refused after the token: it takes over, token and all, once that one is gone.)"""
        eng = self._observed_only()
        return observer_reason(eng) if eng is not None else None

    def _require(self) -> ControlSession:
        session = self.sessions.current
        if session is None:
            observed = self._observed_only()
            if observed is not None:
                raise Observing(observer_reason(observed))
            raise NotAttached("no engine with a control block is attached to this sidecar (is an engine running "
                              f"with control.enabled and engine.shm_dir={self.shm_dir}?)")
        return session

    def _require_owner(self) -> ControlSession:
        """The attached engine, if this sidecar controls it; else NotAttached or ReadOnly (409)."""
        session = self._require()
        if session.read_only:
            raise ReadOnly(f"engine {session.engine.label} is controlled by another sidecar (it holds the control "
                           f"lock on {session.client.path}); this sidecar serves it read-only: send mutations to "
                           "that one")
        return session

    def _require_running(self) -> ControlSession:
        """The attached engine, if a command written now can still be applied; else NotAttached (409)."""
        session = self._require_owner()
        reason = session.engine.stopped_reason()
        if reason:
            raise NotAttached(f"engine {session.engine.label} is not running ({reason}): a command would never be "
                              "applied")
        return session

    @on_loop
    def policy_view(self) -> PolicyView:
        return self._policy_view()

    def _policy_view(self) -> PolicyView:
        session = self.sessions.current
        if session is None:
            return PolicyView(None, None, {}, self.sessions.params)
        policy = session.policy
        pinned = {bucket_label(b): m.label for b, m in sorted(policy.pins.items())}
        return PolicyView(session.engine.label, policy.policy_label, pinned, policy.params, session.read_only)

    @on_loop
    def snapshot(self) -> tuple[PolicyView, ControlSnapshot]:
        """The policy and what the control block says now; NotAttached or ControlFormatError (then control of
        that engine ends: its block was overwritten or truncated)."""
        return self._snapshot()

    async def wait_applied(self, seq: int, wait: float) -> tuple[PolicyView, ControlSnapshot]:
        """`snapshot()` once rank 0 has applied command `seq`, or after `wait` seconds if it has not by then. The
        loop thread answers (a watch: one block read serves every waiting request), so a waiting request holds
        neither the event loop nor a thread."""
        future = self.loop.wait_until(self._snapshot, lambda found: seq_reached(found[1].status.applied_seq, seq),
                                      time.monotonic() + wait)
        return await asyncio.wrap_future(future)

    def _snapshot(self) -> tuple[PolicyView, ControlSnapshot]:
        session = self._require()
        try:
            snap = session.client.snapshot()
        except AreaMidWriteError:  # a writer stopped between its writes: the block is still the engine's
            raise
        except ControlFormatError as exc:
            self.sessions.give_up(session, exc)
            raise
        return self._policy_view(), snap

    @on_loop
    def set_mode(self, mode: str, buckets: list[int] | None) -> tuple[int, Decision]:
        """Pin buckets to a mode, or release them to the auto policy; returns (command seq, decision)."""
        session = self._require_running()
        now = time.monotonic()
        decision = (session.policy.release(buckets, now) if mode == "auto"
                    else session.policy.pin(Mode.parse(mode), buckets, now))
        self.publisher.publish(session, [decision])
        assert decision.command_seq is not None  # publish() writes the command of every decision it publishes
        return decision.command_seq, decision

    @on_loop
    def superseded_by(self, decision: Decision, applied_seq: int) -> Decision | None:
        """The newest request decision that overrode `decision` before rank 0 ran it, else None. A status that
        runs a newer command than `decision`'s only proves the newer table runs: commands are overwritten in place,
        so rank 0 may never have read this one. What runs still holds this request's change unless a later request
        (applied by now) sent one of its buckets elsewhere: automatic decisions and probes never move a pinned
        bucket, and a release leaves the auto policy in charge of what follows."""
        seq = decision.command_seq
        session = self.sessions.current
        if seq is None or session is None or applied_seq == seq:
            return None
        buckets = set(decision.buckets)
        newer = [d for d in session.policy.decisions
                 if d.command_seq is not None and d.reason in REQUEST_REASONS and seq_is_newer(d.command_seq, seq)
                 and seq_reached(applied_seq, d.command_seq) and d.mode != decision.mode
                 and buckets.intersection(d.buckets)]
        return newer[-1] if newer else None

    @on_loop
    def set_params(self, changes: dict[str, Any]) -> PolicyParams:
        """Apply a validated PolicyUpdate's changes; raises ValidationError (changing nothing) for bad ones, and
        ReadOnly while another sidecar controls the attached engine (its parameters are that one's)."""
        session = self.sessions.current
        if session is not None:
            self._require_owner()
        else:
            observed = self._observed_only()
            if observed is not None:  # its parameters would never apply: the controller's policy decides
                raise Observing(observer_reason(observed))
        base = session.policy.params if session else self.sessions.params
        self.sessions.params = params = PolicyParams.model_validate({**base.model_dump(), **changes})
        if session is not None:
            session.policy.set_params(params)
            self.store.save(session)
        return params

    @on_loop
    def decisions(self, limit: int) -> tuple[str | None, list[Decision]]:
        """(engine label, its newest `limit` decisions); decisions are not changed once published."""
        session = self.sessions.current
        return (None, []) if session is None else (session.engine.label, list(session.policy.decisions)[-limit:])

    @on_loop
    def stats(self) -> PolicyStats:
        session = self.sessions.current
        if session is None:
            return PolicyStats(engine=None, stats=[], calls_observed=0, probe_calls=0, probe_share=0.0)
        p = session.policy
        stats = [BucketModeEstimate(bucket=bucket_label(b), mode=m.label, samples=e.samples, mean_seconds=e.mean,
                                 p50_seconds=e.p50, p90_seconds=e.p90, age_seconds=e.age_seconds)
                 for b, m, e in _estimates(p)]
        return PolicyStats(engine=session.engine.label, stats=stats, calls_observed=p.calls_total,
                             probe_calls=p.probe_calls_used, probe_share=p.probe_share,
                             probe_cost_share=p.probe_cost_share)

    def control_view(self) -> ControlView | None:
        """What the control gauges show at a scrape: the active table (read now) and the policy's estimates. On
        the loop thread: the exposition that collects it runs there."""
        session = self.sessions.current
        if session is None:
            return None
        try:
            active = session.client.snapshot().active_table.as_labels()
        except (InvalidTableWordError, AreaMidWriteError) as exc:  # no gauge until the area is readable again
            self._warn_unreadable(str(exc))
            active = {}
        except ControlFormatError as exc:
            self.sessions.give_up(session, exc)
            return None
        estimates = {(bucket_label(b), m.label): est.p50 for b, m, est in _estimates(session.policy)}
        return ControlView(session.engine.label, active, tuple(m.label for m in session.policy.modes), estimates)

    def _warn_unreadable(self, message: str) -> None:
        if message not in self._unreadable_words and len(self._unreadable_words) < MAX_WORD_WARNINGS:
            self._unreadable_words.add(message)
            log.warning("%s; gatherwise_active_mode is left out until it is readable", message)

    @on_loop
    def learned_table(self) -> tuple[ModeTable, dict[str, Any]]:
        session = self._require()
        eng = session.engine
        meta = {"tp": session.client.tp_size, "source": f"gatherwise sidecar auto policy, engine {eng.label}",
                "policy": session.policy.policy_label, "vocab": eng.vocab, "dtype": eng.dtype}
        return session.policy.learned_table(), meta


def _estimates(policy: ModePolicy) -> list[tuple[int, Mode, Estimate]]:
    """(bucket, mode, estimate) of every window of the policy that has samples."""
    now = time.monotonic()
    return [(b, m, est) for b in range(NUM_BUCKETS) for m in policy.modes
            if (est := policy.estimates.get(b, m, now)) is not None]
