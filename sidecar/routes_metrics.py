"""GET /metrics: OpenMetrics (with exemplars) when the Accept header asks for it, classic text otherwise.

A route, not a Starlette Mount: a Mount answers /metrics with a 307 to /metrics/.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from sidecar.state import StateDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}, "application/openmetrics-text": {}}}})
def metrics(request: Request, state: StateDep) -> Response:
    """Prometheus exposition of every gatherwise family (docs/metrics.md)."""
    body, content_type = state.metrics.exposition(request.headers.get("accept"))
    return Response(content=body, media_type=content_type)
