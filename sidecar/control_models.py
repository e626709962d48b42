"""Request and response bodies of the control API (sidecar.routes_control), precise for the OpenAPI schema."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gatherwise.modes import IMPLEMENTED_LABELS, NUM_BUCKETS, bucket_from_upper_bound

# Generated from gatherwise.modes.IMPLEMENTED: a mode the engine implements is accepted and documented here
# (OpenAPI enum) without another change; a reserved one is refused with the list of valid values.
ModeLabel = Literal[IMPLEMENTED_LABELS]  # type: ignore[valid-type]
ModeOrAuto = Literal[(*IMPLEMENTED_LABELS, "auto")]  # type: ignore[valid-type]
BucketTable = dict[str, ModeLabel]  # bucket upper bound ("1", "2", "4", ... "32768") -> mode
MAX_BUCKET = 1 << (NUM_BUCKETS - 1)


class ModeState(BaseModel):
    engine: str = Field(description="engine instance id, 16 hex digits")
    policy: Literal["manual", "auto", "mixed"] = Field(
        description="manual: every bucket pinned by hand; auto: every bucket chosen by the policy; mixed: some")
    active: BucketTable = Field(description="the table every rank runs now (control block status area)")
    requested: BucketTable = Field(description="the table last asked for (control block command area)")
    pinned: BucketTable = Field(description="buckets pinned by hand (the policy never changes them)")
    epoch: int = Field(description="increments each time rank 0 adopts a different table")
    call_index: int = Field(description="the logits call rank 0 started last (heartbeat)")
    heartbeat_age_seconds: float | None = Field(description="seconds since that call started; null before the first")
    requested_seq: int = Field(description="sequence number of the last command")
    applied_seq: int = Field(description="sequence number of the command rank 0 applied last")
    apply_call: int = Field(description="first call index that ran the active table on every rank")
    pending: bool = Field(description="true while the last command is not applied yet")


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
    applied: bool = Field(description="true: every rank runs the new table from apply_call on")
    seq: int = Field(description="sequence number of the command this request wrote")
    apply_call: int | None = Field(description="first call index that runs the new table on every rank; "
                                               "null while not applied")
    decision: int = Field(description="id of the decision logged for this request (GET /v1/decisions)")
    state: ModeState


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
    probe_calls: int = Field(description="of those, calls that ran a mode other than the policy's choice")
    probe_share: float


class DecisionModel(BaseModel):
    id: int
    time: float = Field(description="unix seconds")
    reason: Literal["manual", "auto", "probe", "table_file"]
    mode: ModeOrAuto
    buckets: list[str]
    previous: dict[str, str] = Field(description="bucket -> mode before the decision (changed buckets)")
    evidence: dict[str, Any] = Field(description="estimates, samples, margin (auto, probe); pins (manual)")
    command_seq: int | None


class DecisionsResponse(BaseModel):
    engine: str | None
    decisions: list[DecisionModel] = Field(description="newest last")


class PolicyParamsModel(BaseModel):
    margin: float = Field(ge=0.0, le=10.0, allow_inf_nan=False,
                          description="switch when the other mode is faster by this fraction")
    min_samples: int = Field(ge=1, le=1 << 20, description="samples needed on both sides before switching")
    window: int = Field(ge=8, le=1 << 20, description="newest samples kept per bucket and mode")
    dwell_seconds: float = Field(ge=0.0, le=86400.0, allow_inf_nan=False,
                                 description="minimum time between two switches of one bucket")
    probe_interval_seconds: float = Field(ge=0.0, le=86400.0, allow_inf_nan=False,
                                          description="minimum time between two probes of one bucket")
    probe_calls: int = Field(ge=1, le=1 << 20, description="calls per probe")
    probe_budget: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="max share of calls probing")
    max_sample_age_seconds: float = Field(ge=0.1, le=86400.0, allow_inf_nan=False,
                                          description="samples older than this leave the estimates")
    probe_backoff_max: float = Field(ge=1.0, le=1024.0, allow_inf_nan=False,
                                     description="a mode far behind is probed up to this many times less often")
    probe_backoff_margin: float = Field(ge=0.0, le=10.0, allow_inf_nan=False,
                                        description="far behind = slower than the chosen mode by this fraction; "
                                                    "the chosen mode's cost moving by it ends the back-off")


class PolicyUpdate(BaseModel):
    """Any subset of the parameters; the others keep their values."""

    model_config = STRICT_REQUEST
    margin: float | None = Field(default=None, ge=0.0, le=10.0, allow_inf_nan=False)
    min_samples: int | None = Field(default=None, ge=1, le=1 << 20)
    window: int | None = Field(default=None, ge=8, le=1 << 20)
    dwell_seconds: float | None = Field(default=None, ge=0.0, le=86400.0, allow_inf_nan=False)
    probe_interval_seconds: float | None = Field(default=None, ge=0.0, le=86400.0, allow_inf_nan=False)
    probe_calls: int | None = Field(default=None, ge=1, le=1 << 20)
    probe_budget: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)
    max_sample_age_seconds: float | None = Field(default=None, ge=0.1, le=86400.0, allow_inf_nan=False)
    probe_backoff_max: float | None = Field(default=None, ge=1.0, le=1024.0, allow_inf_nan=False)
    probe_backoff_margin: float | None = Field(default=None, ge=0.0, le=10.0, allow_inf_nan=False)


class PolicyResponse(BaseModel):
    policy: Literal["manual", "auto", "mixed"] | None = Field(description="null when no engine is attached")
    pinned: BucketTable
    params: PolicyParamsModel


class TableFileModel(BaseModel):
    """The learned table in the format of gatherwise/table_file.py (JSON is valid YAML: save and load it)."""

    tp: int
    vocab: int | None = None
    dtype: str | None = None
    source: str
    policy: Literal["manual", "auto", "mixed"]
    table: BucketTable


class ErrorResponse(BaseModel):
    detail: str
