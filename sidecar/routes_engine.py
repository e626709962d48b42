"""GET /v1/engine: the attached engine instance and what the sidecar has ingested from it."""

from __future__ import annotations

from fastapi import APIRouter

from sidecar.ingest import EngineInfo
from sidecar.state import StateDep

router = APIRouter(tags=["engine"])


@router.get("/engine", response_model=EngineInfo)
def engine_info(state: StateDep) -> EngineInfo:
    return state.ingest.info()
