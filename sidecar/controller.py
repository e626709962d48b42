"""The sidecar's loop: ingest the rings, feed the policy, write commands to the control block, keep its state.

One thread (gatherwise.sidecar.loop) does it all, in this order, at the deadlines it computes: poll the rings (batching
calls: see BATCH_RECORDS; at each discovery deadline while no engine is attached; `Ingest.poll_once` hands every
joined call to `_on_call`, which feeds the policy and ends a probe the moment its last call arrives), follow
the attached engine, and step the policy (every STEP_INTERVAL_S while calls arrive; while none do, every
IDLE_TICK_S for probe timeouts and saves). API handlers and the metrics scrape reach the policy through
`Loop.call`: they hand the loop a function and get values the loop copied back (PolicyView, StatsResponse, decisions),
so the policy has one thread and no lock.
What the engine runs is read from the control block (status area), never assumed. The decision state is saved
next to the block (gatherwise.sidecar.policy_state), so a restarted sidecar continues where the killed one stopped.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatherwise.sidecar.control_block_client import (
    AreaMidWriteError,
    ControlClient,
    ControlSnapshot,
    InvalidTableWordError,
)
from gatherwise.sidecar.control_models import BucketModeStats, StatsResponse
from gatherwise.sidecar.decision_events import ControlView, DecisionEvents
from gatherwise.sidecar.estimates import Estimate
from gatherwise.sidecar.ingest import AttachedEngine, Ingest
from gatherwise.sidecar.loop import Loop, on_loop
from gatherwise.sidecar.policy import AutoPolicy, Decision, PolicyParams
from gatherwise.sidecar.policy_state import load_state, policy_from_json, policy_to_json, save_state

from gatherwise.config import GatherwiseConfig
from gatherwise.modes import NUM_BUCKETS, Mode, ModeTable, bucket_label
from gatherwise.shm_format.control import CONTROL_NAME, ControlFormatError, sidecar_state_path

log = logging.getLogger("gatherwise.sidecar.control")
# Saving the state (decision log, sample windows: up to ~0.5 MB of JSON) costs milliseconds of CPU the engine's
# ranks may need. Requests (manual decisions, parameters) are saved at once; the policy's own decisions within
# SAVE_INTERVAL_S; new samples alone every SAMPLES_SAVE_INTERVAL_S (a restart that loses a few seconds of samples
# still has the rest of each window).
SAVE_INTERVAL_S = 1.0
SAMPLES_SAVE_INTERVAL_S = 10.0
# While calls flow the policy steps this often (its decisions are paced in seconds; a probe ends from _on_call);
# without new calls, once a second (probe timeouts are >= 2 s, saves >= 1 s). A step looks at every bucket x mode:
# 20 steps a second cost an auto sidecar ~0.6 % of a core at 100 calls/s (docs/BENCHMARKS.md, "Sidecar CPU").
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
# Distinct unreadable table words warned about (a block written over and over must not flood the log).
MAX_WORD_WARNINGS = 16
# An engine without a control block (control disabled, or rank 0 still starting) is looked at again this often.
ATTACH_RETRY_S = 0.5


class NotAttached(RuntimeError):
    """No engine with a control block is attached."""


class ReadOnly(NotAttached):
    """Another sidecar holds the attached engine's control lock: this one only shows the engine."""


@dataclass
class EngineControl:
    """The control side of the attached engine (its identity and telemetry: sidecar.ingest.AttachedEngine)."""

    engine: AttachedEngine
    client: ControlClient
    policy: AutoPolicy
    state_path: str
    requested: ModeTable | None  # table last written (or found) in the command area
    last_call_index: int = -1  # newest call fed to the policy (ring records re-read after a restart are skipped)
    switch_counts: dict[str, int] = field(default_factory=dict)  # "from|to|reason" -> n, survives restarts
    read_only: bool = False  # another sidecar owns this engine's control (ControlClient.try_own)
    dirty: bool = False  # new samples since the last save
    decided: bool = False  # a policy decision since the last save
    saved_at: float = 0.0


@dataclass(frozen=True)
class PolicyView:
    """The attached engine's policy as the API shows it, copied on the loop thread."""

    engine: str | None  # engine label; None when no engine is attached
    policy: str | None  # manual | auto | mixed
    pinned: dict[str, str]  # bucket label -> mode label
    params: PolicyParams
    read_only: bool = False  # another sidecar controls the engine


class Controller:
    def __init__(self, config: GatherwiseConfig, ingest: Ingest, events: DecisionEvents, *,
                 env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.config, self.ingest, self.events = config, ingest, events
        self.params = config.policy.params
        self.api_token: str | None = config.sidecar.api_token or env.get("GATHERWISE_API_TOKEN") or None
        self.interval = max(config.sidecar.poll_interval_seconds, STEP_INTERVAL_S)
        self.attached: EngineControl | None = None
        self._warned: set[int] = set()
        self._unsaved: set[str] = set()  # state files a save failed for (warned once)
        self._unreadable_words: set[str] = set()  # messages of table words already warned about
        self._next_poll = self._next_attach = self._last_tick = self._polled_at = 0.0
        self._called = False  # calls fed to the policy since its last step
        self.loop = Loop("gatherwise-sidecar", self._step, log)
        ingest.on_call = self._on_call
        events.metrics.control_gauges.view = self.control_view

    # -- service --------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.loop.stop(timeout)
        if self.attached is not None:
            self._save(self.attached)

    # -- the loop's step ------------------------------------------------------------------------------------
    def _step(self) -> float:
        """Whatever is due now, in order; returns the seconds until the next deadline."""
        now = time.monotonic()
        ingest = self.ingest
        if now >= self._next_poll:
            read = ingest.poll_once()
            if ingest.engine is not None:
                self._next_poll = now + self._poll_wait(ingest.engine, read, now)
            else:  # nothing to read until discovery finds an engine
                self._next_poll = now + max(0.0, (ingest.next_discovery_ns - ingest.clock()) * 1e-9)
            if ingest.engine is not (self.attached and self.attached.engine) and now >= self._next_attach:
                self._next_attach = now + ATTACH_RETRY_S
                self._follow(ingest.engine)
        att = self.attached
        if att is None:
            return self._next_poll - time.monotonic()
        tick_at = self._last_tick + (self.interval if self._called else IDLE_TICK_S)
        if now >= tick_at:
            self._tick(att, now)
            self._last_tick, tick_at = now, now + IDLE_TICK_S
            if self.attached is not None and self.attached.policy.probe is not None:  # it waits on its calls
                self._next_poll = min(self._next_poll, now + ingest.poll_interval)
        return min(self._next_poll, tick_at) - time.monotonic()

    def _poll_wait(self, eng: AttachedEngine, read: int, now: float) -> float:
        """Seconds until the next poll of the attached engine, after one that read `read` records."""
        elapsed, self._polled_at = now - self._polled_at, now
        base = self.ingest.poll_interval
        per_rank = read / eng.tp_size
        if per_rank <= 0:  # quiet rings
            return max(base, MAX_POLL_WAIT_S)
        batch = min(BATCH_RECORDS, max(1, eng.readers[0].capacity // 4))
        probe = self.attached.policy.probe if self.attached is not None else None
        if probe is not None:  # the calls the probe still needs, at most: its end is seen soon after it comes
            batch = min(batch, max(1, self.attached.policy.params.probe_calls - probe.calls))
        return min(max(elapsed * batch / per_rank, base), max(base, MAX_POLL_WAIT_S))

    def _tick(self, att: EngineControl, now: float) -> None:
        self._called = False
        if att.read_only:  # no policy here; take over once the owner is gone (its state is in the file)
            if att.client.try_own():
                log.info("engine %s: the sidecar that controlled it is gone; this one takes over", att.engine.label)
                self._detach(att)
                self._attach(att.engine)
            return
        try:
            self._publish(att, att.policy.step(now))
        except ControlFormatError as exc:
            self._give_up(att, exc)
            return
        since = now - att.saved_at
        if (att.decided and since >= SAVE_INTERVAL_S) or (att.dirty and since >= SAMPLES_SAVE_INTERVAL_S):
            self._save(att)

    def _on_call(self, eng: AttachedEngine, call_index: int, mode: int, bucket: int, seconds: float,
                 tag: int) -> None:
        att = self.attached
        if att is None or att.read_only or eng is not att.engine or call_index <= att.last_call_index:
            return
        att.last_call_index = call_index
        policy = att.policy
        if mode not in policy.modes:  # a mode code this sidecar does not choose among: nothing to learn
            return
        now = time.monotonic()
        att.dirty = self._called = True
        if policy.observe(Mode(mode), bucket, seconds, now, tag):
            # the running probe has its calls: end it now, not at the next step, so it costs no extra calls
            try:
                self._publish(att, policy.step(now))
            except ControlFormatError as exc:
                self._give_up(att, exc)

    # -- engine attach / detach ----------------------------------------------------------------------------
    def _follow(self, eng: AttachedEngine | None) -> None:
        att = self.attached
        if att is not None and att.engine is eng:
            return
        if att is not None:
            log.info("engine %s %s: control state of the old instance dropped", att.engine.label,
                     f"replaced by {eng.label}" if eng else "no longer attached")
            self._save(att)
            self._detach(att)
        if eng is not None:
            self._attach(eng)

    def _give_up(self, att: EngineControl, exc: Exception) -> None:
        """The block was overwritten under us: stop controlling this engine (it keeps its last good table)."""
        log.warning("engine %s: control block became unusable, control API disabled for it: %s", att.engine.label, exc)
        self._warned.add(att.engine.engine_id)
        self._detach(att)

    def _detach(self, att: EngineControl) -> None:
        att.client.close()
        self.attached = None
        self.events.forget()

    def _attach(self, eng: AttachedEngine) -> None:
        engine_id = eng.engine_id
        if engine_id in self._warned:
            return
        path = Path(eng.dir) / CONTROL_NAME
        client = None
        try:
            client = ControlClient(path)
            read_only = not client.try_own()  # before the first read: the owner repairs what a dead owner left
            snap = client.snapshot()
        except FileNotFoundError:
            return  # control disabled, or rank 0 has not created it yet: the next poll looks again
        except AreaMidWriteError:  # the owner died between two writes and is not replaced yet: look again
            client.close()
            return
        except (ControlFormatError, OSError) as exc:
            if client is not None:
                client.close()
            self._warned.add(engine_id)
            log.warning("engine %s: control block unusable, control API disabled for it: %s", eng.label, exc)
            return
        if snap.header.engine_id != engine_id:
            client.close()
            return
        state_path = sidecar_state_path(path)
        policy, extra = self._recover(state_path, snap)
        requested = _valid(lambda: snap.requested_table) if snap.command.seq else None
        att = EngineControl(eng, client, policy, state_path, requested, int(extra.get("last_call_index", -1)),
                            dict(extra.get("switch_counts", {})), read_only)
        self.attached = att
        if read_only:  # the owner counts the decisions and keeps the state: nothing of it is written here
            log.warning("engine %s: another sidecar holds its control lock (%s); this sidecar serves it read-only "
                        "and refuses mutations until that one is gone", eng.label, path)
            return
        self.events.restore_switch_counts(eng.label, att.switch_counts)
        if not extra and policy.policy_label != "manual" and self.config.policy.table_file and not snap.command.seq:
            self._adopt_table_file(att)
        self._sync(att)
        log.info("control attached to engine %s (policy %s, active %s)", eng.label, policy.policy_label,
                 _valid(lambda: snap.active_table) or "not readable")

    def _recover(self, state_path: str, snap: ControlSnapshot) -> tuple[AutoPolicy, dict[str, Any]]:
        try:
            text = load_state(state_path)
        except (OSError, ValueError) as exc:  # a symlink, FIFO or oversized file in its place: not ours
            log.warning("%s: not read (%s); starting from the control block alone", state_path, exc)
            text = None
        if text is not None:
            try:
                policy = policy_from_json(text)
                log.info("recovered decision state from %s (%d decisions)", state_path, len(policy.decisions))
                return policy, policy.restored_extra or {"recovered": True}
            except ValueError as exc:
                log.warning("%s: %s; starting from the control block alone", state_path, exc)
        # No saved state (a sidecar before us could not write it): start from what the engine was last asked to run
        start = _valid(lambda: snap.requested_table) or _valid(lambda: snap.active_table) or \
            ModeTable.uniform(Mode.parse(self.config.engine.initial_mode))
        return AutoPolicy(self.params, start, auto=self.config.policy.mode == "auto"), {}

    def _adopt_table_file(self, att: EngineControl) -> None:
        from gatherwise.table_file import load_table_file

        path = self.config.policy.table_file
        try:
            table = load_table_file(path)
        except (OSError, ValueError) as exc:
            log.warning("policy.table_file %s not loaded: %s", path, exc)
            return
        decision = att.policy.adopt_table(table, time.monotonic(), str(path))
        self._publish(att, [decision] if decision else [])

    # -- commands -------------------------------------------------------------------------------------------
    def _sync(self, att: EngineControl, force: bool = False) -> int | None:
        """Write the policy's desired table if it differs from the last command (or when forced)."""
        wanted = att.policy.desired_table()
        if not force and wanted == att.requested:
            return None
        seq = att.client.write_command(wanted)
        att.requested = wanted
        att.dirty = True
        return seq

    def _publish(self, att: EngineControl, decisions: list[Decision]) -> None:
        if not decisions:  # the desired table only changes with a decision: nothing to write
            return
        seq = self._sync(att, force=True)
        call = att.client.heartbeat().call_index
        for d in decisions:
            d.command_seq = seq
            self.events.decision(att.engine.label, d, call, att.switch_counts)
            log.info("decision %d: %s %s -> %s (%s) evidence=%s", d.id, d.reason, ",".join(d.buckets), d.mode,
                     d.previous, d.evidence)
        if any(d.reason in ("manual", "table_file") for d in decisions):
            self._save(att)  # a request's effect survives a SIGKILL right after the response
        else:
            att.decided = True

    def _save(self, att: EngineControl) -> None:
        if att.read_only:
            return
        try:
            save_state(att.state_path, policy_to_json(att.policy, {"last_call_index": att.last_call_index,
                                                                    "switch_counts": att.switch_counts}))
            att.dirty = att.decided = False
            att.saved_at = time.monotonic()
        except FileNotFoundError as exc:  # the engine directory vanished (engine exited): nothing to keep
            log.debug("sidecar state not saved: %s", exc)
        except OSError as exc:  # a full filesystem: decisions go on, the restart point is older (said once)
            if att.state_path not in self._unsaved:
                self._unsaved.add(att.state_path)
                log.warning("sidecar state not saved to %s (a restarted sidecar resumes from the last save): %s",
                            att.state_path, exc)

    # -- API: each public method runs on the loop thread (on_loop) ------------------------------------------
    def _require(self) -> EngineControl:
        att = self.attached
        if att is None:
            raise NotAttached("no engine with a control block is attached to this sidecar (is an engine running "
                              f"with control.enabled and engine.shm_dir={self.config.engine.shm_dir}?)")
        return att

    def _require_owner(self) -> EngineControl:
        """The attached engine, if this sidecar controls it; else NotAttached or ReadOnly (409)."""
        att = self._require()
        if att.read_only:
            raise ReadOnly(f"engine {att.engine.label} is controlled by another sidecar (it holds the control lock "
                           f"on {att.client.path}); this sidecar serves it read-only: send mutations to that one")
        return att

    def _require_running(self) -> EngineControl:
        """The attached engine, if a command written now can still be applied; else NotAttached (409)."""
        att = self._require_owner()
        reason = (self.ingest.stopped_reason(att.engine) if att.engine is self.ingest.engine
                  else "the sidecar no longer follows it")
        if reason:
            raise NotAttached(f"engine {att.engine.label} is not running ({reason}): a command would never be applied")
        return att

    @on_loop
    def policy_view(self) -> PolicyView:
        att = self.attached
        if att is None:
            return PolicyView(None, None, {}, self.params)
        policy = att.policy
        pinned = {bucket_label(b): m.label for b, m in sorted(policy.pins.items())}
        return PolicyView(att.engine.label, policy.policy_label, pinned, policy.params, att.read_only)

    @on_loop
    def snapshot(self) -> tuple[PolicyView, ControlSnapshot]:
        """The policy and what the control block says now; NotAttached or ControlFormatError (then control of
        that engine ends: its block was overwritten or truncated)."""
        att = self._require()
        try:
            snap = att.client.snapshot()
        except AreaMidWriteError:  # a writer stopped between its writes: the block is still the engine's
            raise
        except ControlFormatError as exc:
            self._give_up(att, exc)
            raise
        return self.policy_view(), snap

    @on_loop
    def set_mode(self, mode: str, buckets: list[int] | None) -> tuple[int, Decision]:
        """Pin buckets to a mode, or release them to the auto policy; returns (command seq, decision)."""
        att = self._require_running()
        now = time.monotonic()
        decision = (att.policy.release(buckets, now) if mode == "auto"
                    else att.policy.pin(Mode.parse(mode), buckets, now))
        self._publish(att, [decision])
        return int(decision.command_seq), decision

    @on_loop
    def set_params(self, changes: dict[str, Any]) -> PolicyParams:
        """Apply a validated PolicyUpdate's changes; raises ValidationError (changing nothing) for bad ones, and
        ReadOnly while another sidecar controls the attached engine (its parameters are that one's)."""
        att = self.attached
        if att is not None:
            self._require_owner()
        base = att.policy.params if att else self.params
        self.params = params = PolicyParams.model_validate({**base.model_dump(), **changes})
        if att is not None:
            att.policy.set_params(params)
            self._save(att)
        return params

    @on_loop
    def decisions(self, limit: int) -> tuple[str | None, list[Decision]]:
        """(engine label, its newest `limit` decisions); decisions are not changed once published."""
        att = self.attached
        return (None, []) if att is None else (att.engine.label, list(att.policy.decisions)[-limit:])

    @on_loop
    def stats(self) -> StatsResponse:
        att = self.attached
        if att is None:
            return StatsResponse(engine=None, stats=[], calls_observed=0, probe_calls=0, probe_share=0.0)
        p = att.policy
        stats = [BucketModeStats(bucket=bucket_label(b), mode=m.label, samples=e.samples, mean_seconds=e.mean,
                                 p50_seconds=e.p50, p90_seconds=e.p90, age_seconds=e.age_seconds)
                 for b, m, e in _estimates(p)]
        return StatsResponse(engine=att.engine.label, stats=stats, calls_observed=p.calls_total,
                             probe_calls=p.probe_calls_used, probe_share=p.probe_share,
                             probe_cost_share=p.probe_cost_share)

    @on_loop
    def control_view(self) -> ControlView | None:
        """What the control gauges show at a scrape: the active table (read now) and the policy's estimates."""
        att = self.attached
        if att is None:
            return None
        try:
            active = att.client.snapshot().active_table.as_labels()
        except (InvalidTableWordError, AreaMidWriteError) as exc:  # no gauge until the area is readable again
            self._warn_unreadable(str(exc))
            active = {}
        except ControlFormatError as exc:
            self._give_up(att, exc)
            return None
        estimates = {(bucket_label(b), m.label): est.p50 for b, m, est in _estimates(att.policy)}
        return ControlView(att.engine.label, active, tuple(m.label for m in att.policy.modes), estimates)

    def _warn_unreadable(self, message: str) -> None:
        if message not in self._unreadable_words and len(self._unreadable_words) < MAX_WORD_WARNINGS:
            self._unreadable_words.add(message)
            log.warning("%s; gatherwise_active_mode is left out until it is readable", message)

    @on_loop
    def learned_table(self) -> tuple[ModeTable, dict[str, Any]]:
        att = self._require()
        eng = att.engine
        meta = {"tp": att.client.tp_size, "source": f"gatherwise sidecar auto policy, engine {att.engine.label}",
                "policy": att.policy.policy_label, "vocab": eng.vocab, "dtype": eng.dtype}
        return att.policy.learned_table(), meta


def _valid(table: Callable[[], ModeTable]) -> ModeTable | None:
    """The table, or None when the block holds a word that is no table."""
    try:
        return table()
    except InvalidTableWordError:
        return None


def _estimates(policy: AutoPolicy) -> list[tuple[int, Mode, Estimate]]:
    """(bucket, mode, estimate) of every window of the policy that has samples."""
    now = time.monotonic()
    return [(b, m, est) for b in range(NUM_BUCKETS) for m in policy.modes
            if (est := policy.estimates.get(b, m, now)) is not None]
