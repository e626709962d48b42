"""GET /healthz (the process answers) and GET /readyz (an engine is attached and its heartbeat is fresh)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from sidecar.state import StateDep

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    engine: str | None = None
    heartbeat_age_seconds: float | None = None
    reason: str | None = None


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
def readyz(state: StateDep):
    info = state.ingest.info()
    if not info.attached:
        reason = f"no engine found in {state.ingest.shm_dir}"
    elif not info.up:
        reason = f"engine heartbeat is {info.heartbeat_age_seconds:.1f} s old (stale after " \
                 f"{state.ingest.heartbeat_stale} s) or the engine closed its rings"
    else:
        return Readiness(ready=True, engine=info.engine_id, heartbeat_age_seconds=info.heartbeat_age_seconds)
    body = Readiness(ready=False, engine=info.engine_id, heartbeat_age_seconds=info.heartbeat_age_seconds,
                     reason=reason)
    return JSONResponse(status_code=503, content=body.model_dump())
