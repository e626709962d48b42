"""The policy's decisions, each with its evidence, in a bounded log (GET /v1/decisions, the switch events).

Every decision is stamped with the policy's wall clock (unix seconds) so that the log reads against the
operator's own clocks; everything else in the policy runs on the sidecar's monotonic clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import field
from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as validated_dataclass

from gatherwise.config import ModeOrAuto
from gatherwise.modes import Mode, bucket_label

DECISION_LOG = 256  # decisions kept (also the largest `limit` of GET /v1/decisions)
Reason = Literal["manual", "auto", "probe", "table_file"]
REASONS: tuple[str, ...] = get_args(Reason)


# Also the item of GET /v1/decisions; a pydantic dataclass, so a decision is validated when made.
@validated_dataclass(config=ConfigDict(json_schema_serialization_defaults_required=True))
class Decision:
    """One decision of the policy's log, with its evidence."""

    id: int
    time: Annotated[float, Field(description="unix seconds (the policy's wall clock)")]
    reason: Reason
    mode: Annotated[ModeOrAuto, Field(description="the mode the buckets go to")]
    buckets: Annotated[list[str], Field(description='bucket labels ("1", "2", "4", ...)')]
    previous: Annotated[dict[str, str], Field(description="bucket -> mode before the decision (changed buckets)")]
    evidence: Annotated[dict[str, Any], Field(description="estimates, samples, margin (auto, probe); pins (manual)")
                        ] = field(default_factory=dict)
    command_seq: Annotated[int | None, Field(description="set once written to the control block")] = None


class DecisionLog:
    """The newest DECISION_LOG decisions and the id the next one gets (ids never repeat, across restarts too:
    the saved state carries `next_id`)."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self.decisions: deque[Decision] = deque(maxlen=DECISION_LOG)
        self.next_id = 1
        self.wall_clock = wall_clock

    def record(self, reason: Reason, mode: str, buckets: Iterable[int], previous: dict[int, Mode],
               evidence: dict[str, Any]) -> Decision:
        """Log a decision: `buckets` go to `mode` (a mode label, or "auto" when pins are released)."""
        labels = [bucket_label(b) for b in buckets]
        decision = Decision(self.next_id, self.wall_clock(), reason, mode, labels,
                            {bucket_label(b): m.label for b, m in previous.items()}, evidence)
        self.next_id += 1
        self.decisions.append(decision)
        return decision
