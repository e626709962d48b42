"""422 responses that can always be serialized: FastAPI's default echoes the offending input back, and an input
like NaN (which Python's json accepts in a request body) then fails to encode and turns a 422 into a 500."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
              for e in exc.errors()]
    return JSONResponse({"detail": detail}, status_code=422)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
