"""The live page: GET / (the page), GET /page/{asset} (its script and style sheet) and GET /v1/live (what the
page needs beyond the rest of the API: the engine's rank info, its counters per mode and op, the logits path over
time and the engine's newest sample output).

Every asset ships in the package (`page_assets/`) and is served with a Content-Security-Policy that allows
nothing but this origin: no inline script, no other host to load from or send to. The page reads the API as
any client does; it mutates only through PUT /v1/mode with the token the operator types in. Every handler is a
coroutine; /v1/live's reads run on the sidecar's loop thread, as every other route's do.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, Field

from gatherwise.modes import IMPLEMENTED
from gatherwise.shm_format.control import ControlFormatError
from gatherwise.shm_format.engine_info import RankInfo
from gatherwise.shm_format.hooks_off import HooksOffNotice
from gatherwise.sidecar.api.control_models import ModeState
from gatherwise.sidecar.api.deps import StateDep
from gatherwise.sidecar.api.routes_control import mode_state
from gatherwise.sidecar.control.block_client import InvalidTableWordError
from gatherwise.sidecar.control.control_api import NotAttached
from gatherwise.sidecar.ingest.live_history import MAX_POINTS, HistoryPoint
from gatherwise.sidecar.ingest.live_sample import LiveSample, live_sample
from gatherwise.sidecar.metrics.header_counters import OP_LABELS, EngineCounters, seconds_series
from gatherwise.sidecar.state import SidecarState

router = APIRouter()

# what /page/{name} serves; nothing else
ASSETS = {"page.js": "text/javascript", "page.css": "text/css", "favicon.svg": "image/svg+xml",
          "docs.js": "text/javascript"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-cache"}


def asset(name: str) -> bytes:
    return resources.files("gatherwise.sidecar.api").joinpath("page_assets").joinpath(name).read_bytes()


# GET and HEAD: `curl -I` shows the page's headers (its CSP) without the body
PAGE_METHODS = ["GET", "HEAD"]


@router.api_route("/", methods=PAGE_METHODS, include_in_schema=False)
async def page() -> Response:
    return Response(asset("index.html"), media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


@router.api_route("/docs", methods=PAGE_METHODS, include_in_schema=False)
async def api_docs() -> Response:
    """The API reference, drawn from /openapi.json by a script that ships here, under the page's CSP (FastAPI's
    Swagger UI would load its script from a CDN into this origin, where the page keeps the token)."""
    return Response(asset("docs.html"), media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


@router.api_route("/page/{name}", methods=PAGE_METHODS, include_in_schema=False)
async def page_asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise HTTPException(404, f"no asset {name!r}")
    return Response(asset(name), media_type=media_type, headers=PAGE_HEADERS)


class LiveEngine(BaseModel):
    engine: str = Field(description="engine instance id, 16 hex digits")
    kind: str | None = Field(description="what its ranks' info files name (vLLM, SGLang, the reference engine); "
                                         "null before they are read")
    version: str | None
    model: str | None = Field(description="the model it serves, as its ranks' info files name it; null before "
                                          "they are read or where the engine does not say")
    tp_size: int
    dtype: str
    vocab: int
    ranks: list[RankInfo] = Field(description="each rank's info file (node, pid, sampler per mode), where found")
    up: bool
    stopped: str | None = Field(description="why the engine is not running any more; null while it may be")


class LiveResponse(BaseModel):
    engine: LiveEngine | None
    calls: dict[str, int] = Field(default_factory=dict, description="mode -> logits calls (rank 0's ring header)")
    op_seconds_per_call: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="mode -> op -> seconds per call of that mode, over every rank (ring "
                                          "headers): the first collective, the second operation (broadcast, "
                                          "shard_resolve), sampling and the whole path (logits_path)")
    dropped: dict[str, int] = Field(default_factory=dict, description="reason -> records lost, every rank together "
                                                                      "(overwritten, torn, invalid, timing_*)")
    hooks_off: list[HooksOffNotice] = Field(default_factory=list)
    mode: ModeState | None = Field(None, description="GET /v1/mode's answer, null when it has none (then "
                                                     "mode_error says why): the page polls one endpoint")
    mode_error: str | None = None
    history: list[HistoryPoint] = Field(default_factory=list, description="oldest first, at most `points`")
    sample: LiveSample | None = Field(None, description="the engine's newest sample output (its sample.json: "
                                                        "prompt, text, tokens, wall_ns) and its age; null where "
                                                        "it wrote none (only the reference engine's demo load does)")


def per_call(counters: EngineCounters) -> dict[str, dict[str, float]]:
    """mode -> op -> seconds per call of the mode, every rank's counters together (a rank-call is one call)."""
    out: dict[str, dict[str, float]] = {}
    for mode in IMPLEMENTED:
        calls = sum(rc.calls.get(mode.label, 0) for rc in counters.ranks)  # rank-calls
        if not calls:
            continue
        ops = [OP_LABELS.get(op, op) for op, _ in seconds_series((mode,))]
        out[mode.label] = {op: sum(rc.seconds.get((op, mode.label), 0.0) for rc in counters.ranks) / calls
                           for op in ops}
    return out


@router.get("/v1/live", response_model=LiveResponse, tags=["page"],
            summary="The attached engine's ranks, counters and logits path over time (the live page)")
async def live(state: StateDep,
               points: Annotated[int, Query(ge=1, le=MAX_POINTS, description="newest N history points")] = 120
               ) -> LiveResponse:
    mode, mode_error = None, None
    try:
        mode = mode_state(*await state.control.snapshot())
    except (NotAttached, ControlFormatError, InvalidTableWordError) as exc:
        mode_error = str(exc)
    response = await state.loop.run(lambda: live_response(state, points))
    response.mode, response.mode_error = mode, mode_error
    return response


def live_response(state: SidecarState, points: int) -> LiveResponse:
    """/v1/live's answer but its mode (on the loop thread)."""
    hooks_off = list(state.ingest.hooks_off.notices)
    eng = state.ingest.engine
    counters = state.ingest.counters()
    if eng is None or counters is None:
        return LiveResponse(engine=None, hooks_off=hooks_off)
    _, history = state.live.newest(points)
    ranks = state.live.rank_infos(eng)
    first = ranks[0] if ranks else None
    engine = LiveEngine(engine=eng.label, kind=first.kind if first else None,
                        version=first.version if first else None, model=(first.model or None) if first else None,
                        tp_size=eng.tp_size, dtype=eng.dtype,
                        vocab=eng.vocab, ranks=ranks, up=counters.up, stopped=eng.stopped_reason())
    dropped: dict[str, int] = {}
    for rc in counters.ranks:
        for reason, n in rc.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
    calls = dict(counters.ranks[0].calls) if counters.ranks else {}
    return LiveResponse(engine=engine, calls=calls, op_seconds_per_call=per_call(counters), dropped=dropped,
                        hooks_off=hooks_off, history=history, sample=live_sample(eng.dir))
