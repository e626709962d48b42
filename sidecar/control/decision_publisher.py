"""A decision's way out: the policy's desired table into the command area, then its counters, span event,
log line and save."""

from __future__ import annotations

import logging

from gatherwise.sidecar.control.decision_events import DecisionEvents
from gatherwise.sidecar.control.session import ControlSession
from gatherwise.sidecar.control.session_store import SessionStore
from gatherwise.sidecar.policy.decision_log import Decision

log = logging.getLogger("gatherwise.sidecar.control")
REQUEST_REASONS = ("manual", "table_file")  # decisions someone asked for: saved before the request returns


class DecisionPublisher:
    def __init__(self, events: DecisionEvents, store: SessionStore) -> None:
        self.events, self.store = events, store

    def sync(self, session: ControlSession, force: bool = False) -> int | None:
        """Write the policy's desired table if it differs from the last command (or when forced); returns the
        command's sequence number, None when nothing was written."""
        wanted = session.policy.desired_table()
        if not force and wanted == session.requested:
            return None
        seq = session.client.write_command(wanted)
        session.requested = wanted
        session.dirty = True
        return seq

    def publish(self, session: ControlSession, decisions: list[Decision]) -> None:
        if not decisions:  # the desired table only changes with a decision: nothing to write
            return
        seq = self.sync(session, force=True)
        call = session.client.heartbeat().call_index
        for d in decisions:
            d.command_seq = seq
            self.events.decision(session.engine.label, d, call, session.switch_counts)
            log.info("decision %d: %s %s -> %s (%s) evidence=%s", d.id, d.reason, ",".join(d.buckets), d.mode,
                     d.previous, d.evidence)
        if any(d.reason in REQUEST_REASONS for d in decisions):
            self.store.save(session)  # a request's effect survives a SIGKILL right after the response
        else:
            session.decided = True
