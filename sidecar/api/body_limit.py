"""An ASGI middleware that refuses request bodies above a size before they are read into memory.

FastAPI reads and parses a JSON body before any dependency (the bearer token check included) runs, so without a
limit anyone who can reach the port makes the sidecar buffer an arbitrarily large body. A declared
Content-Length above the limit is answered 413 at once, without reading the body; a chunked body is counted as
it arrives and cut off with 413 as soon as it passes the limit.

Closing a socket whose peer is still sending makes the kernel answer with a reset, and a reset can destroy the
413 before the client reads it. So a refusal lingers as web servers do: the whole 413 goes out first (its
Content-Length tells the client it is complete), then the rest of the body is read and dropped chunk by chunk —
never held — for at most LINGER_SECONDS in all and LINGER_IDLE_SECONDS without data (nginx's lingering_time and
lingering_timeout), and only then is the connection closed. A client that sent `Expect: 100-continue` has
sent nothing yet and is never asked to.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The largest legitimate body (PUT /v1/mode with all 16 buckets, PUT /v1/policy) is a few hundred bytes.
MAX_BODY_BYTES = 64 * 1024
LINGER_SECONDS = 30.0
LINGER_IDLE_SECONDS = 5.0


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES, linger_s: float = LINGER_SECONDS) -> None:
        self.app, self.max_bytes, self.linger_s = app, max_bytes, linger_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await _reply(send, 400, "invalid Content-Length header")
                return
            if size > self.max_bytes:
                waiting = headers.get(b"expect", b"").lower() == b"100-continue"  # has sent no body yet
                await self._refuse(send, receive, f"request body of {size} bytes is above the limit of "
                                   f"{self.max_bytes}", drain=not waiting)
                return
        received = 0
        started = refused = False

        async def limited_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # answer now and tell the app the client is gone: it stops reading, and whatever it still
                    # sends is dropped below
                    refused = True
                    if not started:
                        await self._refuse(send, receive, f"request body is above the limit of {self.max_bytes} "
                                           "bytes", drain=message.get("more_body", False))
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except Exception:
            if not refused:
                raise

    async def _refuse(self, send: Send, receive: Receive, detail: str, *, drain: bool) -> None:
        await refuse(send, receive, 413, detail, drain=drain, linger_s=self.linger_s)


async def refuse(send: Send, receive: Receive, status: int, detail: str, *, drain: bool,
                 linger_s: float = LINGER_SECONDS, headers: Mapping[str, str] | None = None) -> None:
    """Refuse a request whose body is not read: the whole answer first, then (drain) the rest of the body
    dropped, then the connection closed."""
    await _reply(send, status, detail, more_body=True, headers=headers)
    if drain:
        await _drain(receive, linger_s)
    await send({"type": "http.response.body", "body": b""})


def sends_body(scope: Scope) -> bool:
    """Whether the client is sending a body now: it declared one, and is not waiting for a 100 Continue before
    it sends it."""
    headers = dict(scope.get("headers") or ())
    declared = headers.get(b"content-length", b"0").strip() not in (b"", b"0") or b"transfer-encoding" in headers
    return declared and headers.get(b"expect", b"").lower() != b"100-continue"


async def _reply(send: Send, status: int, detail: str, *, more_body: bool = False,
                 headers: Mapping[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *extra]})
    await send({"type": "http.response.body", "body": body, "more_body": more_body})


async def _drain(receive: Receive, linger_s: float) -> None:
    """Read and drop the rest of a refused body until it ends, the client leaves or stalls, or linger_s passed."""
    deadline = time.monotonic() + linger_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = await asyncio.wait_for(receive(), min(left, LINGER_IDLE_SECONDS))
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
