"""The sidecar's control loop: follows the attached engine, feeds the policy, writes commands, keeps state.

Threads: the ingest thread calls `_on_call` for every joined call; this controller's own thread runs `tick()`
every poll interval; API handlers call the public methods. One lock guards it all (every section is short).
What the engine runs is read from the control block (status area), never assumed. The decision state is saved
next to the block (sidecar.policy_state), so a restarted sidecar continues where the killed one stopped.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatherwise.config import GatherwiseConfig
from gatherwise.modes import NUM_BUCKETS, Mode, ModeTable, bucket_label
from gatherwise.shm_format.control import CONTROL_NAME, ControlFormatError, sidecar_state_path
from sidecar.control_client import ControlClient, ControlSnapshot
from sidecar.control_gauges import ControlView
from sidecar.decision_events import DecisionEvents
from sidecar.periodic import PeriodicThread
from sidecar.policy import AutoPolicy, Decision, PolicyParams
from sidecar.policy_state import load_state, policy_from_json, policy_to_json, save_state

log = logging.getLogger("gatherwise.sidecar.control")
# Saving the state (decision log, sample windows: up to ~0.5 MB of JSON) costs milliseconds of CPU the engine's
# ranks may need. Requests (manual decisions, parameters) are saved at once; the policy's own decisions within
# SAVE_INTERVAL_S; new samples alone every SAMPLES_SAVE_INTERVAL_S (a restart that loses a few seconds of samples
# still has the rest of each window).
SAVE_INTERVAL_S = 1.0
SAMPLES_SAVE_INTERVAL_S = 10.0
CONTROL_INTERVAL_MIN_S = 0.05


class NotAttached(RuntimeError):
    """No engine with a control block is attached."""


@dataclass
class Attached:
    engine_id: int
    label: str
    client: ControlClient
    policy: AutoPolicy
    state_path: str
    requested: ModeTable | None  # table last written (or found) in the command area
    last_call_index: int = -1  # newest call fed to the policy (ring records re-read after a restart are skipped)
    switch_counts: dict[str, int] = field(default_factory=dict)  # "from|to|reason" -> n, survives restarts
    dirty: bool = False  # new samples since the last save
    decided: bool = False  # a policy decision since the last save
    saved_at: float = 0.0
    active: ModeTable | None = None  # what every rank ran at the last tick (control block status area)


class Controller:
    def __init__(self, config: GatherwiseConfig, ingest: Any, events: DecisionEvents, *,
                 env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.config, self.ingest, self.events = config, ingest, events
        self.params = PolicyParams.from_config(config.policy)
        self.api_token: str | None = config.sidecar.api_token or env.get("GATHERWISE_API_TOKEN") or None
        # Decisions need no faster loop than this (dwell is seconds; a probe ends from _on_call), and every tick
        # costs CPU the engine's ranks may need on a small host.
        self.interval = max(config.sidecar.poll_interval_seconds, CONTROL_INTERVAL_MIN_S)
        self.lock = threading.RLock()
        self.attached: Attached | None = None
        self._warned: set[int] = set()
        self._loop = PeriodicThread("gatherwise-control", self.tick, self.interval, log)
        ingest.call_listeners.append(self._on_call)
        events.metrics.control_gauges.view = self.control_view

    # -- service --------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._loop.stop(timeout)
        with self.lock:
            if self.attached is not None:
                self._save(self.attached)

    def tick(self) -> None:
        with self.lock:
            self._follow_engine()
            att = self.attached
            if att is None:
                return
            now = time.monotonic()
            att.policy.clock_wall = time.time()
            try:
                self._publish(att, att.policy.step(now))
                snap = att.client.snapshot()
            except ControlFormatError as exc:
                self._give_up(att, exc)
                return
            att.active = snap.active_table
            since = now - att.saved_at
            if (att.decided and since >= SAVE_INTERVAL_S) or (att.dirty and since >= SAMPLES_SAVE_INTERVAL_S):
                self._save(att)

    # -- engine attach / detach ----------------------------------------------------------------------------
    def _follow_engine(self) -> None:
        eng = self.ingest.engine
        att = self.attached
        if (att is None and eng is None) or (att is not None and eng is not None and eng.engine_id == att.engine_id):
            return
        if att is not None:
            log.info("engine %s %s: control state of the old instance dropped", att.label,
                     f"replaced by {eng.label}" if eng else "no longer attached")
            self._save(att)
            att.client.close()
            self.attached = None
            self.events.forget()
        if eng is not None:
            self._attach(eng.engine_id, Path(eng.dir) / CONTROL_NAME)

    def _give_up(self, att: Attached, exc: Exception) -> None:
        """The block was overwritten under us: stop controlling this engine (it keeps its last good table)."""
        log.warning("engine %s: control block became unusable, control API disabled for it: %s", att.label, exc)
        self._warned.add(att.engine_id)
        att.client.close()
        self.attached = None
        self.events.forget()

    def _attach(self, engine_id: int, path: Path) -> None:
        if engine_id in self._warned:
            return
        try:
            client = ControlClient(path)
            snap = client.snapshot()
        except FileNotFoundError:
            return  # control disabled, or rank 0 has not created it yet
        except (ControlFormatError, OSError) as exc:
            if engine_id not in self._warned:
                self._warned.add(engine_id)
                log.warning("engine %016x: control block unusable, control API disabled for it: %s", engine_id, exc)
            return
        if snap.header.engine_id != engine_id:
            client.close()
            return
        label = f"{engine_id:016x}"
        state_path = sidecar_state_path(path)
        policy, extra = self._recover(state_path, snap)
        requested = snap.requested_table if snap.command.seq else None
        att = Attached(engine_id, label, client, policy, state_path, requested,
                       int(extra.get("last_call_index", -1)), dict(extra.get("switch_counts", {})))
        self.attached = att
        self.events.restore_switch_counts(label, att.switch_counts)
        if not extra and policy.policy_label != "manual" and self.config.policy.table_file and not snap.command.seq:
            self._adopt_table_file(att)
        self._sync(att)
        log.info("control attached to engine %s (policy %s, active %s)", label, policy.policy_label,
                 snap.active_table)

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
        auto = self.config.policy.mode == "auto"
        return AutoPolicy(self.params, snap.requested_table, auto=auto), {}

    def _adopt_table_file(self, att: Attached) -> None:
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
    def _sync(self, att: Attached, force: bool = False) -> int | None:
        """Write the policy's desired table if it differs from the last command (or when forced)."""
        wanted = att.policy.desired_table()
        if not force and wanted == att.requested:
            return None
        seq = att.client.write_command(wanted)
        att.requested = wanted
        att.dirty = True
        return seq

    def _publish(self, att: Attached, decisions: list[Decision]) -> None:
        if not decisions:  # the desired table only changes with a decision: nothing to write
            return
        seq = self._sync(att, force=True)
        call = att.client.heartbeat().call_index
        for d in decisions:
            d.command_seq = seq
            self.events.decision(att.label, d, call, att.switch_counts)
            log.info("decision %d: %s %s -> %s (%s) evidence=%s", d.id, d.reason, ",".join(d.buckets), d.mode,
                     d.previous, d.evidence)
        if any(d.reason in ("manual", "table_file") for d in decisions):
            self._save(att)  # a request's effect survives a SIGKILL right after the response
        else:
            att.decided = True

    def _save(self, att: Attached) -> None:
        try:
            save_state(att.state_path, policy_to_json(att.policy, {"last_call_index": att.last_call_index,
                                                                    "switch_counts": att.switch_counts}))
            att.dirty = att.decided = False
            att.saved_at = time.monotonic()
        except OSError as exc:  # the engine directory vanished (engine exited): nothing to keep
            log.debug("sidecar state not saved: %s", exc)

    def _on_call(self, eng: Any, call_index: int, mode: int, rows: int, seconds: float) -> None:
        with self.lock:
            att = self.attached
            if att is None or eng.engine_id != att.engine_id or call_index <= att.last_call_index:
                return
            att.last_call_index = call_index
            policy = att.policy
            if mode not in policy.modes:  # a mode code this sidecar does not choose among: nothing to learn
                return
            now = time.monotonic()
            att.dirty = True
            if policy.observe(Mode(mode), rows, seconds, now):
                # the running probe has its calls: end it now, not at the next tick, so it costs no extra calls
                policy.clock_wall = time.time()
                try:
                    self._publish(att, policy.step(now))
                except ControlFormatError as exc:
                    self._give_up(att, exc)

    # -- API ------------------------------------------------------------------------------------------------
    def require(self) -> Attached:
        att = self.attached
        if att is None:
            raise NotAttached("no engine with a control block is attached to this sidecar (is an engine running "
                              f"with control.enabled and engine.shm_dir={self.config.engine.shm_dir}?)")
        return att

    def require_running(self) -> Attached:
        """The attached engine, if a command written now can still be applied; else NotAttached (409)."""
        att = self.require()
        eng = self.ingest.engine
        reason = (self.ingest.stopped_reason(eng) if eng is not None and eng.engine_id == att.engine_id
                  else "the sidecar no longer follows it")
        if reason:
            raise NotAttached(f"engine {att.label} is not running ({reason}): a command would never be applied")
        return att

    def snapshot(self) -> tuple[Attached, ControlSnapshot]:
        with self.lock:
            att = self.require()
            return att, att.client.snapshot()

    def set_mode(self, mode: str, buckets: list[int] | None) -> tuple[int, Decision]:
        """Pin buckets to a mode, or release them to the auto policy; returns (command seq, decision)."""
        with self.lock:
            att = self.require_running()
            att.policy.clock_wall = time.time()
            now = time.monotonic()
            if mode == "auto":
                decision = att.policy.release(buckets, now)
            else:
                decision = att.policy.pin(Mode.parse(mode), buckets, now)
            self._publish(att, [decision])
            return int(decision.command_seq), decision

    def set_params(self, changes: dict[str, Any]) -> PolicyParams:
        with self.lock:
            base = self.attached.policy.params if self.attached else self.params
            params = PolicyParams(**{**base.__dict__, **changes})
            self.params = params
            if self.attached is not None:
                self.attached.policy.set_params(params)
                self._save(self.attached)
            return params

    def current_params(self) -> PolicyParams:
        with self.lock:
            return self.attached.policy.params if self.attached else self.params

    def control_view(self) -> ControlView | None:
        """What the control gauges show at a scrape: the active table and the policy's estimates."""
        with self.lock:
            att = self.attached
            if att is None or att.active is None:
                return None
            now = time.monotonic()
            modes = att.policy.modes
            estimates = {}
            for b in range(NUM_BUCKETS):
                for m in modes:
                    est = att.policy.estimates.get(b, m, now)
                    if est is not None:
                        estimates[(bucket_label(b), m.label)] = est.p50
            return ControlView(att.label, att.active.as_labels(), tuple(m.label for m in modes), estimates)

    def stats(self) -> tuple[Attached | None, list[tuple[int, Mode, Any]]]:
        with self.lock:
            att = self.attached
            if att is None:
                return None, []
            now = time.monotonic()
            rows = []
            for b in range(NUM_BUCKETS):
                for m in att.policy.modes:
                    est = att.policy.estimates.get(b, m, now)
                    if est is not None:
                        rows.append((b, m, est))
            return att, rows

    def learned_table(self) -> tuple[ModeTable, dict[str, Any]]:
        with self.lock:
            att = self.require()
            eng = self.ingest.engine
            meta = {"tp": att.client.tp_size, "source": f"gatherwise sidecar auto policy, engine {att.label}",
                    "policy": att.policy.policy_label}
            if eng is not None and eng.engine_id == att.engine_id:
                meta.update(vocab=eng.vocab, dtype=eng.dtype)
            return att.policy.learned_table(), meta

