"""A control session's decision state on disk: recovered at attach, saved after requests and on a schedule.

Why a schedule: saving the state (decision log, sample windows: up to ~0.5 MB of JSON) costs milliseconds of CPU
the engine's ranks may need. Requests (manual decisions, parameters) are saved at once; the policy's own
decisions within SAVE_INTERVAL_S; new samples alone every SAMPLES_SAVE_INTERVAL_S (a restart that loses a few
seconds of samples still has the rest of each window). The format: gatherwise.sidecar.policy.saved_state.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gatherwise.config import PolicyParams
from gatherwise.modes import Mode, ModeTable
from gatherwise.sidecar.control.block_client import ControlSnapshot
from gatherwise.sidecar.control.session import ControlSession, readable_table
from gatherwise.sidecar.policy.mode_policy import ModePolicy
from gatherwise.sidecar.policy.saved_state import MAX_STATE_BYTES, load_state, policy_from_json, save_state, state_text

log = logging.getLogger("gatherwise.sidecar.control")
SAVE_INTERVAL_S = 1.0
SAMPLES_SAVE_INTERVAL_S = 10.0


class SessionStore:
    def __init__(self, initial_mode: str, auto: bool) -> None:
        """`initial_mode` and `auto`: the policy of an engine no state was saved for (engine.initial_mode,
        policy.mode == "auto")."""
        self.initial_mode, self.auto = initial_mode, auto
        self._unsaved: set[str] = set()  # state files a save failed for (warned once)
        self._trimmed: set[str] = set()  # state files saved without their sample windows (warned once)

    def recover(self, state_path: str, snap: ControlSnapshot, params: PolicyParams
                ) -> tuple[ModePolicy, dict[str, Any]]:
        """(policy, what the session saved with it); without a readable saved state, a policy `params` starts
        from what the engine was last asked to run, and no extra."""
        try:
            text = load_state(state_path)
        except (OSError, ValueError) as exc:  # a symlink, FIFO or oversized file in its place: not ours
            log.warning("%s: not read (%s); starting from the control block alone", state_path, exc)
            text = None
        if text is not None:
            try:
                policy = policy_from_json(text)
            except ValueError as exc:
                log.warning("%s: %s; starting from the control block alone", state_path, exc)
            else:
                log.info("recovered decision state from %s (%d decisions)", state_path, len(policy.decisions))
                extra = dict(policy.restored_extra)
                fed, started = extra.get("last_call_index", -1), snap.heartbeat.call_index
                if fed > started:  # no sidecar fed a call rank 0 has not started: every call would be skipped
                    log.warning("%s: last_call_index %d is beyond the engine's call %d; the policy is fed every "
                                "call from the rings on", state_path, fed, started)
                    extra["last_call_index"] = -1
                return policy, extra
        # No saved state (a sidecar before us could not write it): start from what the engine was last asked to run
        start = readable_table(lambda: snap.requested_table) or readable_table(lambda: snap.active_table) or \
            ModeTable.uniform(Mode.parse(self.initial_mode))
        return ModePolicy(params, start, auto=self.auto), {}

    def save(self, session: ControlSession) -> None:
        if session.read_only:
            return
        try:
            text, trimmed = state_text(session.policy, {
                "last_call_index": session.last_call_index, "switch_counts": session.switch_counts})
            if trimmed and session.state_path not in self._trimmed:
                self._trimmed.add(session.state_path)
                log.warning("%s: the sidecar state with its sample windows is above %d bytes (policy.window %d); "
                            "it is saved without them, and a restarted sidecar relearns them", session.state_path,
                            MAX_STATE_BYTES, session.policy.params.window)
            save_state(session.state_path, text)
            session.dirty = session.decided = False
            session.saved_at = time.monotonic()
        except FileNotFoundError as exc:  # the engine directory vanished (engine exited): nothing to keep
            log.debug("sidecar state not saved: %s", exc)
        except OSError as exc:  # a full filesystem: decisions go on, the restart point is older (said once)
            if session.state_path not in self._unsaved:
                self._unsaved.add(session.state_path)
                log.warning("sidecar state not saved to %s (a restarted sidecar resumes from the last save): %s",
                            session.state_path, exc)

    def save_if_due(self, session: ControlSession, now: float) -> None:
        since = now - session.saved_at
        if (session.decided and since >= SAVE_INTERVAL_S) or (session.dirty and since >= SAMPLES_SAVE_INTERVAL_S):
            self.save(session)
