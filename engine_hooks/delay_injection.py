"""Tests and benchmarks only: add a fixed delay to one mode's collective, in phases over time.

Lets a test make either mode the slow one on purpose and move that over time (config control.inject_delay).
The delay sits inside the collective call, so it shows in the collective's timing like real wire time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from gatherwise.config import DelayPhase
from gatherwise.engine_hooks.comm import Communicator


class DelayedCommunicator:
    def __init__(self, inner: Communicator, phases: Sequence[DelayPhase], start: float | None = None) -> None:
        self.inner = inner
        self.rank, self.world_size = inner.rank, inner.world_size
        self.phases = sorted(phases, key=lambda p: p.after_seconds)
        self.start = time.monotonic() if start is None else start

    def delay_for(self, mode: str, now: float | None = None) -> float:
        """Seconds to add to a `mode` collective now: the latest phase that has begun decides."""
        elapsed = (time.monotonic() if now is None else now) - self.start
        current = None
        for phase in self.phases:
            if phase.after_seconds <= elapsed:
                current = phase
        return current.seconds if current is not None and current.mode == mode else 0.0

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self._sleep("all_gather")
        self.inner.all_gather(out, inp)

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor) -> None:
        self._sleep("gather")
        self.inner.gather(out, inp)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.inner.broadcast(tensor)

    def _sleep(self, mode: str) -> None:
        delay = self.delay_for(mode)
        if delay > 0:
            time.sleep(delay)
