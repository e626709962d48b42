"""LoggedLogitsPath: a LogitsPath that also keeps the mode and the collectives of every call it ends.

For tests, the reference engine's run report and the GPU checks, which compare what ran with what should
have: the hot class itself keeps no per-call lists (a serving engine would grow them without end).
"""

from __future__ import annotations

from typing import Any

import torch

from gatherwise.engine_hooks.logits_path import LogitsPath
from gatherwise.engine_hooks.sharded_exchange import ShardedCall
from gatherwise.modes import Mode


class LoggedLogitsPath(LogitsPath):
    """LogitsPath with `mode_log` (the mode of every call, in order) and `collective_log` (the collectives
    each call issued: 1 in all_gather mode, gather + broadcast in gather mode, 1 or 2 in sharded mode)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # LogitsPath's own parameters
        super().__init__(*args, **kwargs)
        self.mode_log: list[Mode] = []
        self.collective_log: list[int] = []

    def _end_call(self, mode: Mode, batch: int, word_in: torch.Tensor, t_start: int, coll_start: int,
                  coll_end: int, second_start: int, second_end: int, sample_start: int, sample_end: int,
                  kind: int, sharded: ShardedCall | None = None) -> None:
        super()._end_call(mode, batch, word_in, t_start, coll_start, coll_end, second_start, second_end,
                          sample_start, sample_end, kind, sharded)
        self.mode_log.append(mode)
        self.collective_log.append(sharded.collectives if sharded is not None else
                                   1 if mode == Mode.ALL_GATHER else 2)
