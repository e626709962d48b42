"""Operator pins: buckets set to a mode by hand (`PUT /v1/mode <mode>`), which the auto choice never touches.

A pin only overrides; the auto choice keeps its own mode for a pinned bucket underneath, so that `auto` can
return to it (gatherwise.sidecar.policy.mode_policy decides which of the two a released bucket continues from).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gatherwise.modes import NUM_BUCKETS, Mode, ModeTable


def chosen_buckets(buckets: Iterable[int] | None) -> list[int]:
    """The buckets a request names, sorted and once each; None names every bucket."""
    return list(range(NUM_BUCKETS)) if buckets is None else sorted(set(buckets))


@dataclass
class Pins:
    """bucket -> the mode an operator pinned it to."""

    modes: dict[int, Mode] = field(default_factory=dict)

    def __contains__(self, bucket: int) -> bool:
        return bucket in self.modes

    @property
    def label(self) -> str:
        """What GET /v1/mode calls the policy: auto (no pin), manual (every bucket pinned) or mixed."""
        if not self.modes:
            return "auto"
        return "manual" if len(self.modes) == NUM_BUCKETS else "mixed"

    def over(self, choice: Sequence[Mode]) -> ModeTable:
        """The table of `choice` (a mode per bucket) with the pins laid over it."""
        return ModeTable(tuple(self.modes.get(b, choice[b]) for b in range(NUM_BUCKETS)))

    def pin(self, mode: Mode, buckets: Iterable[int]) -> None:
        for b in buckets:
            self.modes[b] = mode

    def release(self, bucket: int) -> Mode | None:
        """Drop the bucket's pin; returns the mode it was pinned to (None when it was not pinned)."""
        return self.modes.pop(bucket, None)
