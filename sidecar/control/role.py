"""The sidecar's role for the engine it reads: the controller, or an observer.

Only rank 0 reads the control block, and rank 0 creates it in its own node's engine directory: so the one sidecar
that can change the mode is the sidecar whose directory holds the block (on a multi-node group, the sidecar on
rank 0's node). Every other sidecar observes: it shows its node's ranks, refuses every mutation (409, with the
reason below) and runs no policy. A second sidecar on the controller's node that does not hold the control lock
observes too (gatherwise.sidecar.control.session_lifecycle), until the first one is gone.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal

from gatherwise.shm_format.control import CONTROL_NAME
from gatherwise.sidecar.ingest.attached_engine import AttachedEngine

Role = Literal["controller", "observer"]
ROLES: tuple[Role, ...] = ("controller", "observer")


def has_control_block(eng: AttachedEngine) -> bool:
    """The engine's control block can be in the directory this sidecar reads: the directory holds rank 0 (which
    creates the block in its own directory) and a regular file of that name, not a link. Whether it is rank 0's
    block is known once it is opened (SessionLifecycle.open checks its writer); only a session makes a controller."""
    if 0 not in eng.ranks:
        return False
    try:
        return stat.S_ISREG(os.lstat(Path(eng.dir) / CONTROL_NAME).st_mode)
    except OSError:
        return False


def observer_reason(eng: AttachedEngine) -> str:
    """Why a sidecar without the engine's control block only observes it (the 409 of every mutation)."""
    if 0 not in eng.ranks:
        node = eng.node
        where = f" (node {node.node_index} of {node.nodes})" if node is not None else ""
        ranks = ", ".join(map(str, eng.ranks))
        return (f"this sidecar observes engine {eng.label}: its node{where} holds TP ranks {ranks} of "
                f"{eng.tp_size}, and the control block lives on TP rank 0's node; send mutations to the sidecar "
                "there")
    return (f"this sidecar observes engine {eng.label}: the engine has no control block (control.enabled is false, "
            "or rank 0 could not create it), so nothing can change its mode")
