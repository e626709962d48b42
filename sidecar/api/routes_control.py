"""The control API under /v1: mode (get, set with wait), stats, decisions, policy parameters, learned table.

Mutations need `Authorization: Bearer <token>` (sidecar.api_token or env GATHERWISE_API_TOKEN). Secure by
default: with no token configured, every mutation answers 403 saying how to set one. Invalid input is a 4xx
and changes nothing: bodies are validated completely before any state is touched. Its 422 responses can always
be serialized (`validation_error`): FastAPI's default echoes the offending input back, and an input like
NaN (which Python's json accepts in a request body) then fails to encode and turns a 422 into a 500.

Every handler is a coroutine that awaits the control API (each call runs on the sidecar's loop thread:
gatherwise.sidecar.control.loop), so a request never blocks the event loop nor holds a pool thread, however long
it waits: `PUT /v1/mode?wait=600` is a watch the loop thread answers when the switch lands or the wait expires.
"""

from __future__ import annotations

import hmac
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from gatherwise.modes import parse_buckets
from gatherwise.shm_format.control import ControlFormatError, seq_reached
from gatherwise.sidecar.api.control_models import (
    DecisionsResponse,
    ErrorResponse,
    LearnedTable,
    ModeState,
    PolicyResponse,
    PolicyUpdate,
    SetModeRequest,
    SetModeResult,
    StatsResponse,
)
from gatherwise.sidecar.api.deps import StateDep
from gatherwise.sidecar.api.strict_json import StrictJSONRoute
from gatherwise.sidecar.control.block_client import ControlSnapshot, InvalidTableWordError
from gatherwise.sidecar.control.control_api import ControlApi, NotAttached, Observing, PolicyView
from gatherwise.sidecar.policy.decision_log import DECISION_LOG
from gatherwise.validation_errors import request_error_details

router = APIRouter(tags=["control"], route_class=StrictJSONRoute)  # a repeated JSON key is a 422
bearer = HTTPBearer(auto_error=False, description="the sidecar's API token (sidecar.api_token or "
                                                  "GATHERWISE_API_TOKEN)")
ResponsesDoc = dict[int | str, dict[str, Any]]  # the `responses` of a route (FastAPI's type)
NO_ENGINE: ResponsesDoc = {409: {"model": ErrorResponse, "description": "no engine with a control block is attached, "
                                                                       "or this sidecar observes the engine"}}
AUTH: ResponsesDoc = {401: {"model": ErrorResponse, "description": "missing or wrong bearer token"},
        403: {"model": ErrorResponse, "description": "no API token configured: mutations are disabled"}}


async def control_api(state: StateDep) -> ControlApi:
    return state.control


ControlApiDep = Annotated[ControlApi, Depends(control_api)]


def token_refusal(token: str | None, credentials: str | None) -> HTTPException | None:
    """Why a mutation presenting bearer `credentials` is refused when the sidecar's token is `token`, else None."""
    if token is None:
        return HTTPException(403, "mutations are disabled because no API token is configured: set "
                                  "sidecar.api_token in the config or GATHERWISE_API_TOKEN in the sidecar's "
                                  "environment, then send 'Authorization: Bearer <token>'")
    if credentials is None or not hmac.compare_digest(credentials.encode(), token.encode()):
        return HTTPException(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                             headers={"WWW-Authenticate": "Bearer"})
    return None


def bearer_credentials(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, as HTTPBearer reads it; None otherwise."""
    scheme, credentials = get_authorization_scheme_param(authorization)
    return credentials if scheme.lower() == "bearer" and credentials else None


async def require_token(ctl: ControlApiDep,
                  creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    refusal = token_refusal(ctl.api_token, creds.credentials if creds is not None else None)
    if refusal is not None:
        raise refusal


async def require_controller(ctl: ControlApiDep) -> None:
    """A sidecar that observes the engine refuses every mutation, whatever the token: no token would make it
    succeed there, and the reason says where the controller is."""
    reason = await ctl.mutation_refusal()
    if reason is not None:
        raise HTTPException(409, reason)


async def refusal_before_body(ctl: ControlApi, authorization: str | None) -> HTTPException | None:
    """What MUTATION refuses a request with, from its headers alone, else None: the mutation gate asks before it
    lets anything read the body, so a body nobody may send is never waited for."""
    reason = await ctl.mutation_refusal()
    if reason is not None:
        return HTTPException(409, reason)
    return token_refusal(ctl.api_token, bearer_credentials(authorization))


Authorized = Depends(require_token)
MUTATION = [Depends(require_controller), Authorized]  # in this order: an observer's 409 before the token's 401/403


def conflict(exc: Exception) -> HTTPException:
    return HTTPException(409, str(exc))


def mode_state(view: PolicyView, snap: ControlSnapshot) -> ModeState:
    return ModeState(
        engine=view.engine, policy=view.policy, active=snap.active_table.as_labels(),
        requested=snap.requested_table.as_labels(), pinned=view.pinned, epoch=snap.status.epoch,
        call_index=snap.heartbeat.call_index, call_started_age_seconds=snap.rank0_heartbeat_age_seconds(),
        requested_seq=snap.command.seq, applied_seq=snap.status.applied_seq, apply_call=snap.status.apply_call,
        pending=snap.pending, read_only=view.read_only, role="observer" if view.read_only else "controller")


@router.get("/mode", response_model=ModeState, responses=NO_ENGINE, summary="Active and requested mode table")
async def get_mode(ctl: ControlApiDep) -> ModeState | JSONResponse:
    try:
        return mode_state(*await ctl.snapshot())
    except Observing as exc:
        return JSONResponse(ErrorResponse(detail=str(exc), role="observer").model_dump(), status_code=409)
    except (NotAttached, ControlFormatError, InvalidTableWordError) as exc:
        raise conflict(exc) from None


@router.put("/mode", response_model=SetModeResult, dependencies=MUTATION,
            responses={202: {"model": SetModeResult, "description": "not applied when the wait ran out"},
                       409: {"model": SetModeResult | ErrorResponse,
                             "description": "a later request sent these buckets elsewhere before every rank ran "
                                            "this one (`superseded_by`); or no running engine with a control "
                                            "block, or another sidecar controls it"},
                       **AUTH}, summary="Pin buckets to a mode, or release them to the auto policy")
async def put_mode(body: SetModeRequest, ctl: ControlApiDep,
                   wait: Annotated[float, Query(ge=0.0, le=600.0, allow_inf_nan=False,
                                                description="seconds to wait until every rank switched")] = 5.0
                   ) -> SetModeResult | JSONResponse:
    buckets = parse_buckets(body.buckets)
    try:
        seq, decision = await ctl.set_mode(body.mode, buckets)
        view, snap = await ctl.wait_applied(seq, wait)  # the loop thread answers: nothing here blocks or polls
        state = mode_state(view, snap)
    except (NotAttached, ControlFormatError, InvalidTableWordError) as exc:
        raise conflict(exc) from None
    reached = seq_reached(snap.status.applied_seq, seq)
    overridden = await ctl.superseded_by(decision, snap.status.applied_seq) if reached else None
    applied = reached and overridden is None
    result = SetModeResult(applied=applied, seq=seq, apply_call=snap.status.apply_call if applied else None,
                           decision=decision.id, state=state)
    if overridden is not None:
        result.superseded_by = overridden.command_seq
        result.detail = (f"superseded: command {overridden.command_seq} (decision {overridden.id}, "
                         f"{overridden.mode} for buckets {','.join(overridden.buckets)}) replaced this request's "
                         f"command; every rank runs that one (this one's table may never have run)")
        return JSONResponse(result.model_dump(), status_code=409)
    return result if applied else JSONResponse(result.model_dump(), status_code=202)


@router.get("/stats", response_model=StatsResponse, summary="Per bucket x mode critical-path estimates")
async def get_stats(ctl: ControlApiDep) -> StatsResponse:
    return StatsResponse.model_validate(asdict(await ctl.stats()))


@router.get("/decisions", response_model=DecisionsResponse, summary="Recent decisions with their evidence")
async def get_decisions(ctl: ControlApiDep,
                  limit: Annotated[int, Query(ge=1, le=DECISION_LOG, description="newest N decisions")] = 50
                  ) -> DecisionsResponse:
    engine, recent = await ctl.decisions(limit)
    return DecisionsResponse(engine=engine, decisions=recent)


@router.get("/policy", response_model=PolicyResponse, summary="Auto policy parameters")
async def get_policy(ctl: ControlApiDep) -> PolicyResponse:
    view = await ctl.policy_view()
    return PolicyResponse(policy=view.policy, pinned=view.pinned, params=view.params)


@router.put("/policy", response_model=PolicyResponse, dependencies=MUTATION,
            responses={409: {"model": ErrorResponse, "description": "another sidecar controls the engine"},
                       **AUTH}, summary="Change auto policy parameters (any subset)")
async def put_policy(body: PolicyUpdate, ctl: ControlApiDep) -> PolicyResponse:
    try:
        await ctl.set_params(body.model_dump(exclude_none=True))
    except NotAttached as exc:
        raise conflict(exc) from None
    return await get_policy(ctl)


@router.get("/policy/table", response_model=LearnedTable, responses=NO_ENGINE,
            summary="The learned table, in the table-file format (load it with policy.table_file)")
async def get_policy_table(ctl: ControlApiDep) -> LearnedTable:
    try:
        table, meta = await ctl.learned_table()
    except NotAttached as exc:
        raise conflict(exc) from None
    return LearnedTable(table=table.as_labels(), **meta)


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse({"detail": request_error_details(exc.errors())}, status_code=422)
