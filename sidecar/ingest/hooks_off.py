"""Engine processes whose gatherwise hooks are off, from their hooks-off notices (gatherwise/shm_format/hooks_off.py).

Such an engine has no rings, so without its notice the sidecar would only say "no engine". The watch re-reads
the notices at each discovery pass (gatherwise.sidecar.ingest.discovery);
`gatherwise_engine_hooks_off{engine_kind, reason}` (gatherwise.sidecar.metrics.hooks_off_gauge) counts the live
processes per reason, `GET /v1/engine` lists them with their text, and `/readyz` names them when no engine is attached.
"""

from __future__ import annotations

import os

from gatherwise.shm_format.hooks_off import HooksOffNotice, read_notices


class HooksOffWatch:
    """The notices of live engine processes in shm_dir, as of the last scan."""

    def __init__(self, shm_dir: str | os.PathLike, remove_dead: bool = True) -> None:
        self.shm_dir, self.remove_dead = shm_dir, remove_dead
        self.notices: tuple[HooksOffNotice, ...] = ()

    def scan(self) -> None:
        self.notices = tuple(read_notices(self.shm_dir, self.remove_dead))

    def summary(self) -> str | None:
        """One line naming them, or None when there are none."""
        if not self.notices:
            return None
        first = self.notices[0]
        more = f" (and {len(self.notices) - 1} more)" if len(self.notices) > 1 else ""
        return f"gatherwise hooks are off in {first.engine} process {first.pid} ({first.reason}): {first.detail}{more}"
