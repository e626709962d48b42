"""The routes' dependencies: the sidecar's state, as create_app() was given it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gatherwise.sidecar.state import SidecarState


async def get_state(request: Request) -> SidecarState:
    """FastAPI dependency: the state create_app() was given (a coroutine: a sync dependency would take a pool
    thread per request)."""
    state: SidecarState = request.app.state.gatherwise
    return state


StateDep = Annotated[SidecarState, Depends(get_state)]
