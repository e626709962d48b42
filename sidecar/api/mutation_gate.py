"""An ASGI middleware that refuses a mutation from its headers alone, before anything reads its body.

FastAPI reads and parses a request's body before any dependency runs, the bearer token check included, so a
client without a token could make the sidecar wait for a body it would refuse anyway (a body sent one byte at a
time holds the connection until it ends). The gate asks the same question as the mutating routes' dependencies
(gatherwise.sidecar.api.routes_control.refusal_before_body: the observer's 409, then the token's 403/401) before
passing such a request on, and answers a refusal without reading the body (BodySizeLimit's refusal: the whole
answer, then what the client still sends is dropped briefly, then the connection is closed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection

from fastapi import HTTPException
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from gatherwise.sidecar.api.body_limit import refuse, sends_body

Refusal = Callable[[str | None], Awaitable[HTTPException | None]]  # Authorization header -> why it is refused


class MutationGate:
    def __init__(self, app: ASGIApp, guarded: Collection[tuple[str, str]], refusal: Refusal) -> None:
        """`guarded`: the (method, path) pairs of the mutating routes; `refusal`: what one is refused with."""
        self.app, self.guarded, self.refusal = app, frozenset(guarded), refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["method"], scope["path"]) in self.guarded:
            refused = await self.refusal(Headers(scope=scope).get("authorization"))
            if refused is not None:
                await refuse(send, receive, refused.status_code, str(refused.detail), drain=sends_body(scope),
                             headers=refused.headers)
                return
        await self.app(scope, receive, send)
