"""The sidecar's FastAPI app: metrics, health, engine info, the /v1 control routes and the live page.

create_app() starts the sidecar's loop (gatherwise.sidecar.control.schedule) with the app's lifespan and stops it
on shutdown. OpenAPI at /openapi.json, drawn as text at /docs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from gatherwise import HOOKS_VERSION
from gatherwise.sidecar.api import routes_control, routes_page, routes_status
from gatherwise.sidecar.api.body_limit import BodySizeLimit
from gatherwise.sidecar.api.mutation_gate import MutationGate
from gatherwise.sidecar.state import SidecarState

# Routers and their prefixes
ROUTERS = [
    (routes_status.router, ""),
    (routes_control.router, "/v1"),
    (routes_page.router, ""),
]


def create_app(state: SidecarState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.schedule.start()
        try:
            yield
        finally:
            state.schedule.stop()
            if state.tracer is not None:
                state.tracer.shutdown()

    # No Swagger UI or ReDoc: they load their scripts from a CDN; /docs is the page's own (routes_page)
    app = FastAPI(title="gatherwise sidecar", version=HOOKS_VERSION, lifespan=lifespan, docs_url=None,
                  redoc_url=None, description="Metrics, traces and control for the logits collective of a TP engine.")
    app.state.gatherwise = state
    for router, prefix in ROUTERS:
        app.include_router(router, prefix=prefix)
    # Starlette types every handler as taking Exception, though it calls it only with the class registered here
    app.add_exception_handler(RequestValidationError, routes_control.validation_error)  # type: ignore[arg-type]
    app.add_middleware(MutationGate, guarded=guarded_routes(),
                       refusal=lambda authorization: routes_control.refusal_before_body(state.control, authorization))
    app.add_middleware(BodySizeLimit)  # outermost: a too-large body is refused before anything reads it
    return app


def guarded_routes() -> set[tuple[str, str]]:
    """(method, path) of every route that needs the API token: the mutation gate refuses those from their
    headers, before their body is read."""
    return {(method, prefix + route.path) for router, prefix in ROUTERS for route in router.routes
            if isinstance(route, APIRoute)
            and any(d.dependency is routes_control.require_token for d in route.dependencies)
            for method in route.methods or ()}
