"""LoggedLogitsPath: a LogitsPath that also keeps the mode and the collectives of every call it ends.

For tests, the reference engine's run report and the GPU checks, which compare what ran with what should
have: the hot class itself keeps no per-call lists (a serving engine would grow them without end).
"""

from __future__ import annotations

from typing import Any

from gatherwise.engine_hooks.logits_path import LogitsPath, OpenCall
from gatherwise.engine_hooks.sharded_exchange import ShardedCall
from gatherwise.modes import Mode


class LoggedLogitsPath(LogitsPath):
    """LogitsPath with `mode_log` (the mode of every call, in order) and `collective_log` (the collectives
    each call issued: 1 in all_gather mode, gather + broadcast in gather mode, 1 or 2 in sharded mode)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # LogitsPath's own parameters
        super().__init__(*args, **kwargs)
        self.mode_log: list[Mode] = []
        self.collective_log: list[int] = []

    def _end_call(self, call: OpenCall, second_start: int, second_end: int, sample_start: int, sample_end: int,
                  sharded: ShardedCall | None = None) -> None:
        super()._end_call(call, second_start, second_end, sample_start, sample_end, sharded)
        self.mode_log.append(call.mode)
        self.collective_log.append(sharded.collectives if sharded is not None else
                                   1 if call.mode == Mode.ALL_GATHER else 2)
