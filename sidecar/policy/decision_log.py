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

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.dataclasses import dataclass as validated_dataclass

from gatherwise.config import ModeOrAuto
from gatherwise.modes import Mode, bucket_label

DECISION_LOG = 256  # decisions kept (also the largest `limit` of GET /v1/decisions)
Reason = Literal["manual", "auto", "probe", "table_file"]
REASONS: tuple[str, ...] = get_args(Reason)


class KindEvidence(BaseModel):
    model_config = ConfigDict(extra="allow")
    probes: int = 0
    ratio: float = 1.0


class PairedEvidence(BaseModel):
    model_config = ConfigDict(extra="allow")
    probes: int = 0
    ratio: float = 1.0
    coverage: float = 0.0
    kinds: dict[str, KindEvidence] = Field(default_factory=dict)


class EvidenceShape(BaseModel):
    """The keys of a decision's evidence that its readers interpret (the live page), with their types: a value of
    another type (null where a number or an object belongs) is refused where the decision is made or read back
    from the saved state, never handed to a reader. The defaults only stand for absent keys: the evidence itself
    is kept as written, other keys included."""

    model_config = ConfigDict(extra="allow")
    phase: Literal["start", "end"] = "start"
    probe_calls: int = 0
    probe_cost_share: float = 0.0
    mix: dict[str, float] = Field(default_factory=dict)
    paired: dict[str, PairedEvidence] = Field(default_factory=dict)


_EVIDENCE = TypeAdapter(EvidenceShape)


def _typed_evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    _EVIDENCE.validate_python(evidence)
    return evidence


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
    evidence: Annotated[dict[str, Any], AfterValidator(_typed_evidence),
                        Field(description="estimates, samples, margin (auto, probe); pins (manual)")
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
