"""Control of the attached engine: a session is opened when ingest follows a new engine, and ended when it is
replaced, when its control block becomes unusable, or when the sidecar that held its lock is gone (then a
read-only session is reopened as the owner).

Opening a session: the control block is opened and its lock tried before the first read (the owner repairs what
a dead owner left), the decision state is recovered (gatherwise.sidecar.control.session_store), and the policy's
table is written when it differs from the last command. An engine whose block is unusable is remembered (by engine id)
and never tried again: one warning, not one per poll.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from gatherwise.config import GatherwiseConfig, PolicyParams
from gatherwise.shm_format.control import CONTROL_NAME, ControlFormatError, sidecar_state_path
from gatherwise.sidecar.control.block_client import AreaMidWriteError, ControlClient
from gatherwise.sidecar.control.decision_events import DecisionEvents
from gatherwise.sidecar.control.decision_publisher import DecisionPublisher
from gatherwise.sidecar.control.role import has_control_block
from gatherwise.sidecar.control.session import ControlSession, readable_table
from gatherwise.sidecar.control.session_store import SessionStore
from gatherwise.sidecar.ingest.attached_engine import AttachedEngine

log = logging.getLogger("gatherwise.sidecar.control")


class SessionLifecycle:
    def __init__(self, config: GatherwiseConfig, events: DecisionEvents, store: SessionStore,
                 publisher: DecisionPublisher) -> None:
        self.config, self.events, self.store, self.publisher = config, events, store, publisher
        self.params: PolicyParams = config.policy.params  # a new session's policy parameters
        self.current: ControlSession | None = None
        self._unusable: set[int] = set()  # engine ids whose control block was unusable (warned once)

    def follow(self, eng: AttachedEngine | None) -> None:
        """Make `eng` (the engine ingest reads) the one controlled: end the session of any other."""
        session = self.current
        if session is not None and session.engine is eng:
            return
        if session is not None:
            log.info("engine %s %s: control state of the old instance dropped", session.engine.label,
                     f"replaced by {eng.label}" if eng else "no longer attached")
            self.store.save(session)
            self.end(session)
        if eng is not None:
            self.open(eng)

    def attaching(self, eng: AttachedEngine) -> bool:
        """`eng` has a control block this sidecar has not opened (nor given up on) yet: /readyz waits for it, so
        that a command sent once the sidecar is ready finds the engine."""
        current = self.current
        if (current is not None and current.engine is eng) or eng.engine_id in self._unusable:
            return False
        return has_control_block(eng)

    def take_over_if_free(self, session: ControlSession) -> None:
        """A read-only session becomes the owner once the sidecar that held the lock is gone (its state is in
        the file)."""
        if session.client.try_own():
            log.info("engine %s: the sidecar that controlled it is gone; this one takes over", session.engine.label)
            self.end(session)
            self.open(session.engine)

    def give_up(self, session: ControlSession, exc: Exception) -> None:
        """The block was overwritten under us: stop controlling this engine (it keeps its last good table)."""
        log.warning("engine %s: control block became unusable, control API disabled for it: %s",
                    session.engine.label, exc)
        self._unusable.add(session.engine.engine_id)
        self.end(session)

    def end(self, session: ControlSession) -> None:
        session.client.close()
        self.current = None
        self.events.forget()

    def open(self, eng: AttachedEngine) -> None:
        engine_id = eng.engine_id
        if engine_id in self._unusable or not has_control_block(eng):
            if engine_id not in self._unusable and 0 not in eng.ranks and os.path.lexists(_block_path(eng)):
                self._unusable.add(engine_id)  # rank 0 writes its block into its own directory only
                log.warning("engine %s: %s is in a directory without TP rank 0, so it is not the engine's control "
                            "block; this sidecar observes the engine", eng.label, _block_path(eng))
            return
        block_path = _block_path(eng)
        client = None
        try:
            client = ControlClient(block_path)
            read_only = not client.try_own()  # before the first read: the owner repairs what a dead owner left
            snap = client.snapshot()
        except FileNotFoundError:
            return  # control disabled, or rank 0 has not created it yet: the next poll looks again
        except AreaMidWriteError:  # the owner died between two writes and is not replaced yet: look again
            if client is not None:  # always set: only the reads after opening raise this
                client.close()
            return
        except (ControlFormatError, OSError) as exc:
            if client is not None:
                client.close()
            self._unusable.add(engine_id)
            log.warning("engine %s: control block unusable, control API disabled for it: %s", eng.label, exc)
            return
        if snap.header.engine_id != engine_id:
            client.close()
            self._unusable.add(engine_id)
            log.warning("engine %s: its control block %s belongs to engine %016x: control API disabled for it",
                        eng.label, block_path, snap.header.engine_id)
            return
        rank0_pid = eng.readers[eng.ranks.index(0)].header().writer_pid
        if snap.header.writer_pid != rank0_pid:  # a copy of the block (another node's): rank 0 never reads it
            client.close()
            self._unusable.add(engine_id)
            log.warning("engine %s: %s was written by pid %d, not by TP rank 0 (pid %d, its ring's writer): not the "
                        "engine's control block, control API disabled for it", eng.label, block_path,
                        snap.header.writer_pid, rank0_pid)
            return
        state_path = sidecar_state_path(block_path)
        policy, extra = self.store.recover(state_path, snap, self.params)
        requested = readable_table(lambda: snap.requested_table) if snap.command.seq else None
        session = ControlSession(eng, client, policy, state_path, requested,
                                 last_call_index=int(extra.get("last_call_index", -1)),
                                 switch_counts=dict(extra.get("switch_counts", {})), read_only=read_only)
        self.current = session
        if read_only:  # the owner counts the decisions and keeps the state: nothing of it is written here
            log.warning("engine %s: another sidecar holds its control lock (%s); this sidecar serves it read-only "
                        "and refuses mutations until that one is gone", eng.label, block_path)
            return
        self.events.restore_switch_counts(eng.label, session.switch_counts)
        table_file = self.config.policy.table_file
        if not extra and policy.policy_label != "manual" and table_file and not snap.command.seq:
            self._adopt_table_file(session, table_file)
        self.publisher.sync(session)
        log.info("control attached to engine %s (policy %s, active %s)", eng.label, policy.policy_label,
                 readable_table(lambda: snap.active_table) or "not readable")

    def _adopt_table_file(self, session: ControlSession, table_path: str) -> None:
        from gatherwise.table_file import load_table_file

        try:
            table = load_table_file(table_path)
        except (OSError, ValueError) as exc:
            log.warning("policy.table_file %s not loaded: %s", table_path, exc)
            return
        decision = session.policy.adopt_table(table, time.monotonic(), str(table_path))
        self.publisher.publish(session, [decision] if decision else [])


def _block_path(eng: AttachedEngine) -> Path:
    return Path(eng.dir) / CONTROL_NAME
