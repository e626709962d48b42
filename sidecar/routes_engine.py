"""GET /v1/engine: the attached engine instance and what the sidecar has ingested from it."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter
from pydantic import BaseModel

from sidecar.state import StateDep

router = APIRouter(tags=["engine"])


class EngineInfoResponse(BaseModel):
    attached: bool
    shm_dir: str
    engine_id: str | None = None
    tp_size: int | None = None
    vocab: int | None = None
    dtype: str | None = None
    up: bool = False
    heartbeat_age_seconds: float | None = None
    records_ingested: int = 0
    records_dropped: int = 0
    calls_joined: int = 0
    calls_incomplete: int = 0
    calls_pending: int = 0
    traces_started: int = 0
    engines_seen: int = 0


@router.get("/engine", response_model=EngineInfoResponse)
def engine_info(state: StateDep) -> EngineInfoResponse:
    info = dataclasses.asdict(state.ingest.info())
    return EngineInfoResponse(shm_dir=str(state.ingest.shm_dir), engines_seen=state.ingest.engines_seen, **info)
