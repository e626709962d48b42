"""An ASGI middleware that refuses request bodies above a size before they are read into memory.

FastAPI reads and parses a JSON body before any dependency (the bearer token check included) runs, so without a
limit anyone who can reach the port makes the sidecar buffer an arbitrarily large body. A declared
Content-Length above the limit is answered 413 at once, without reading the body; a chunked body is counted as
it arrives and cut off with 413 as soon as it passes the limit.
"""

from __future__ import annotations

import json
from typing import Any

# The largest legitimate body (PUT /v1/mode with all 16 buckets, PUT /v1/policy) is a few hundred bytes.
MAX_BODY_BYTES = 64 * 1024


class BodySizeLimit:
    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await _reply(send, 400, "invalid Content-Length header")
                return
            if size > self.max_bytes:
                await _reply(send, 413, f"request body of {size} bytes is above the limit of {self.max_bytes}")
                return
        received = 0
        started = refused = False

        async def limited_receive() -> dict:
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
                        await _reply(send, 413, f"request body is above the limit of {self.max_bytes} bytes")
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: dict) -> None:
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


async def _reply(send: Any, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
