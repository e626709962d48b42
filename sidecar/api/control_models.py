"""Request and response bodies of the control API (gatherwise.sidecar.api.routes_control), precise for the OpenAPI
schema.

What exists elsewhere is not declared again: the policy parameters and their ranges come from the config schema
(gatherwise.config.PolicyParams; PolicyUpdate derives from it), a decision is
gatherwise.sidecar.policy.decision_log.Decision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from gatherwise.config import ModeLabel, ModeOrAuto, PolicyParams
from gatherwise.modes import NUM_BUCKETS, bucket_from_upper_bound
from gatherwise.sidecar.control.role import Role
from gatherwise.sidecar.policy.decision_log import Decision
from gatherwise.table_file import TableDocument

BucketTable = dict[str, ModeLabel]  # bucket upper bound ("1", "2", "4", ... "32768") -> mode
PolicyLabel = Literal["manual", "auto", "mixed"]  # gatherwise.sidecar.policy.pins.Pins.label
MAX_BUCKET = 1 << (NUM_BUCKETS - 1)


class ModeState(BaseModel):
    engine: str = Field(description="engine instance id, 16 hex digits")
    policy: PolicyLabel = Field(
        description="manual: every bucket pinned by hand; auto: every bucket chosen by the policy; mixed: some")
    active: BucketTable = Field(description="the table every rank runs now (control block status area)")
    requested: BucketTable = Field(description="the table last asked for (control block command area)")
    pinned: BucketTable = Field(description="buckets pinned by hand (the policy never changes them)")
    epoch: int = Field(description="increments each time rank 0 adopts a different table")
    call_index: int = Field(description="the logits call rank 0 started last (heartbeat)")
    call_started_age_seconds: float | None = Field(
        description="seconds since rank 0 started that call (its control-block heartbeat); null before the first")
    requested_seq: int = Field(description="sequence number of the last command")
    applied_seq: int = Field(description="sequence number of the command rank 0 applied last")
    apply_call: int = Field(description="first call index that ran the active table on every rank")
    pending: bool = Field(description="true while the last command is not applied yet")
    read_only: bool = Field(False, description="true when another sidecar holds this engine's control lock: this "
                                               "one shows the engine and refuses mutations (409)")
    role: Role = Field("controller", description="controller: this sidecar may change the mode; observer: it "
                                                 "holds no control lock (read_only), and refuses mutations")


# Request bodies are strict: JSON true or 8.0 is not the integer 1 or 8, and "8" is not a number.
STRICT_REQUEST = ConfigDict(extra="forbid", strict=True)


class SetModeRequest(BaseModel):
    model_config = STRICT_REQUEST
    mode: ModeOrAuto = Field(description="pin the buckets to a mode, or release them to the auto policy")
    buckets: list[int] | None = Field(
        default=None, min_length=1, max_length=NUM_BUCKETS,
        description=f"bucket upper bounds (powers of two 1..{MAX_BUCKET}); omitted = every bucket")

    @field_validator("buckets")
    @classmethod
    def _bounds(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            for bound in value:
                bucket_from_upper_bound(bound)  # ValueError -> 422 with its message
        return value


class SetModeResult(BaseModel):
    applied: bool = Field(description="true: every rank runs this request's change from apply_call on (in this "
                                      "command's table, or in a later command's that kept it)")
    seq: int = Field(description="sequence number of the command this request wrote")
    apply_call: int | None = Field(description="first call index from which every rank runs the table that holds "
                                               "this request's change (a later command's when one carried it); "
                                               "null while not applied")
    decision: int = Field(description="id of the decision logged for this request (GET /v1/decisions)")
    state: ModeState
    superseded_by: int | None = Field(None, description="409 only: the seq of a later request's command that sent "
                                                        "some of these buckets elsewhere before every rank ran this "
                                                        "one (its table never ran, or no longer does)")
    detail: str | None = Field(None, description="409 only: the superseding command in words")


class BucketModeStats(BaseModel):
    bucket: str
    mode: ModeLabel
    samples: int = Field(description="samples in the window (at most policy.window, none older than "
                                     "policy.max_sample_age_seconds)")
    mean_seconds: float
    p50_seconds: float = Field(description="the policy's robust estimate of the cross-rank critical path")
    p90_seconds: float
    age_seconds: float = Field(description="seconds since the newest sample")


class StatsResponse(BaseModel):
    engine: str | None
    stats: list[BucketModeStats]
    calls_observed: int = Field(description="joined calls the policy has seen for this engine")
    probe_calls: int = Field(description="of those, calls whose table named a mode other than the policy's choice")
    probe_share: float
    probe_cost_share: float = Field(0.0, description="seconds probes added beyond the running mode's cost for the "
                                                     "same calls, as a share of all seconds observed (what "
                                                     "policy.probe_budget bounds)")


class DecisionsResponse(BaseModel):
    engine: str | None
    decisions: list[Decision] = Field(description="newest last")


def all_optional(model: type[BaseModel], name: str, doc: str) -> type[BaseModel]:
    """The Update model of `model` (the Base/Update pattern): every field optional (null or absent = unchanged),
    with the same type and constraints, and strict like every request body."""
    fields: dict[str, Any] = {}
    for key, field in model.model_fields.items():
        assert field.annotation is not None  # pydantic sets it on every field of a built model
        optional = field.annotation | None
        annotated = (optional, *field.metadata)  # a tuple subscript: Annotated[X, *m] needs Python 3.11
        fields[key] = (Annotated[annotated] if field.metadata else optional,
                       Field(None, description=field.description))
    config = ConfigDict(**{**model.model_config, **STRICT_REQUEST, "frozen": False})
    return create_model(name, __config__=config, __doc__=doc, **fields)


if TYPE_CHECKING:
    class PolicyUpdate(BaseModel):
        """What the checker sees of the model built below (a class built at run time is no type to it)."""
else:
    PolicyUpdate = all_optional(PolicyParams, "PolicyUpdate",
                                "Any subset of the parameters; the others keep their values.")


class PolicyResponse(BaseModel):
    policy: PolicyLabel | None = Field(description="null when no engine is attached")
    pinned: BucketTable
    params: PolicyParams


class LearnedTable(TableDocument):
    """The learned table as a table file (gatherwise.table_file): save the JSON and load it as a starting table."""

    tp: int
    source: str
    policy: PolicyLabel
    table: BucketTable


class ErrorResponse(BaseModel):
    detail: str
    role: Role | None = Field(None, description="GET /v1/mode on a sidecar that observes the attached engine: "
                                                "observer (its node has no control block)")
