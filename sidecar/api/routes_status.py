"""The read-only status endpoints: GET /healthz (the process answers), GET /readyz (an engine is attached, its
heartbeat is fresh and its control block, if it has one, is attached), GET /v1/engine (the attached engine, what
the sidecar has ingested from it and the route each rank runs) and GET /metrics (OpenMetrics with exemplars when
the Accept header asks for it, classic text otherwise).

/metrics is a route, not a Starlette Mount: a Mount answers /metrics with a 307 to /metrics/. Every handler is a
coroutine; what reads the sidecar's state runs on its loop thread (gatherwise.sidecar.control.loop: the one
threading rule), the whole exposition of a scrape included.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from gatherwise.shm_format.engine_info import RankRoute
from gatherwise.sidecar.api.deps import StateDep
from gatherwise.sidecar.control.role import Role
from gatherwise.sidecar.ingest.attached_engine import EngineInfo
from gatherwise.sidecar.state import SidecarState

router = APIRouter()


@dataclass(frozen=True)
class RankRouteOf:
    """The route one rank runs (its info file's): the engine's runner class, the runner gatherwise recognised it
    as, and what its fingerprints matched."""

    rank: int
    kind: str
    route: RankRoute


@dataclass(frozen=True)
class EngineWithRoutes(EngineInfo):
    routes: tuple[RankRouteOf, ...] = ()  # the ranks read here whose info files were read


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    engine: str | None = None
    heartbeat_age_seconds: float | None = None
    reason: str | None = None
    role: Role | None = None  # controller or observer of the attached engine (GET /v1/mode), null without one


@router.get("/healthz", response_model=Health, tags=["health"])
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}}, tags=["health"])
async def readyz(state: StateDep) -> Readiness | JSONResponse:
    return await state.loop.run(lambda: readiness(state))


def readiness(state: SidecarState) -> Readiness | JSONResponse:
    """/readyz's answer (on the loop thread)."""
    info = state.ingest.info()
    found = state.control.attached_role()
    role = found[1] if found is not None else None
    if not info.attached:
        reason = f"no engine found in {info.shm_dir}"
        hooks_off = state.ingest.hooks_off.summary()
        if hooks_off:
            reason = f"{reason}; {hooks_off}"
    elif not info.up:
        reason = f"engine heartbeat is {info.heartbeat_age_seconds:.1f} s old (stale after " \
                 f"{state.ingest.heartbeat_stale} s) or the engine closed its rings"
    elif (eng := state.ingest.engine) is not None and state.control.sessions.attaching(eng):
        reason = "engine attached; its control block is not attached yet"
    else:
        return Readiness(ready=True, engine=info.engine_id, heartbeat_age_seconds=info.heartbeat_age_seconds,
                         role=role)
    body = Readiness(ready=False, engine=info.engine_id, heartbeat_age_seconds=info.heartbeat_age_seconds,
                     reason=reason, role=role)
    return JSONResponse(status_code=503, content=body.model_dump())


@router.get("/v1/engine", response_model=EngineWithRoutes, tags=["engine"])
async def engine_info(state: StateDep) -> EngineWithRoutes:
    return await state.loop.run(lambda: engine_with_routes(state))


def engine_with_routes(state: SidecarState) -> EngineWithRoutes:
    """/v1/engine's answer (on the loop thread)."""
    info = state.ingest.info()
    eng = state.ingest.engine
    routes = () if eng is None else tuple(RankRouteOf(i.rank, i.kind, i.route) for i in state.live.rank_infos(eng))
    return EngineWithRoutes(**{f.name: getattr(info, f.name) for f in fields(info)}, routes=routes)


@router.get("/metrics", response_class=Response, tags=["metrics"],
            responses={200: {"content": {"text/plain": {}, "application/openmetrics-text": {}}}})
async def metrics(request: Request, state: StateDep) -> Response:
    """Prometheus exposition of every gatherwise family (docs/metrics.md)."""
    accept = request.headers.get("accept")
    body, content_type = await state.loop.run(lambda: state.metrics.exposition(accept))
    return Response(content=body, media_type=content_type)
