"""Request bodies whose JSON objects repeat a key are refused (422), not read as "the last one wins".

Python's json module keeps the last of two equal keys, so `{"mode": "gather", "mode": "all_gather"}` would mean
whatever the last one says while a proxy, a log or an audit that reads the first one sees another request.
The control routes use StrictJSONRoute: their request's json() rejects a repeated key as a JSON decode error,
which FastAPI answers with its usual 422 (type json_invalid, naming the key).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def loads_strict(text: str | bytes) -> Any:
    """json.loads, raising json.JSONDecodeError for an object that repeats a key."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        doc = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        raise json.JSONDecodeError(f"duplicate key {exc.key[:80]!r}", doc, 0) from None


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_strict(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict
