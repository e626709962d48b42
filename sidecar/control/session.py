"""The control side of the attached engine: its control block, its policy and what has been written and saved.

Its identity and telemetry are gatherwise.sidecar.ingest.attached_engine.AttachedEngine;
gatherwise.sidecar.control.session_lifecycle opens and ends sessions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gatherwise.modes import ModeTable
from gatherwise.sidecar.control.block_client import ControlClient, InvalidTableWordError
from gatherwise.sidecar.ingest.attached_engine import AttachedEngine
from gatherwise.sidecar.policy.call_costs import CallCosts
from gatherwise.sidecar.policy.mode_policy import ModePolicy


@dataclass
class ControlSession:
    engine: AttachedEngine
    client: ControlClient
    policy: ModePolicy
    state_path: str  # the saved decision state (gatherwise.sidecar.policy.saved_state)
    requested: ModeTable | None  # table last written (or found) in the command area
    last_call_index: int = -1  # newest call fed to the policy (ring records re-read after a restart are skipped)
    switch_counts: dict[str, int] = field(default_factory=dict)  # "from|to|reason" -> n, survives restarts
    read_only: bool = False  # another sidecar owns this engine's control (ControlClient.try_own)
    dirty: bool = False  # new samples since the last save
    decided: bool = False  # a policy decision since the last save
    saved_at: float = 0.0
    costs: CallCosts = field(default_factory=CallCosts)  # what each call costs its mode (policy.cost)


def readable_table(table: Callable[[], ModeTable]) -> ModeTable | None:
    """The table, or None when the block holds a word that is no table."""
    try:
        return table()
    except InvalidTableWordError:
        return None
