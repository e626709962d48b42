"""docs/api.md against the sidecar's app: its Endpoints table against the routes and, for the routes in the OpenAPI
schema, their status codes; each endpoint's own status table and every `METHOD /path` the docs name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from gatherwise.config import EngineSection, GatherwiseConfig
from gatherwise.sidecar.api.app import ROUTERS, create_app
from gatherwise.sidecar.state import build_state
from tests.docs.markdown import DOCS, ROOT, code_spans, read, table, tables

DOC = "docs/api.md"
Route = tuple[str, str]  # (method, path)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    shm = tmp_path_factory.mktemp("shm")
    yield create_app(build_state(GatherwiseConfig(engine=EngineSection(shm_dir=str(shm)))))


def served_routes(app: FastAPI) -> set[Route]:
    """Every (method, path) the app serves: its routers' routes under their prefixes, and the app's own
    (FastAPI's schema and docs pages). HEAD comes with every GET and is not listed."""
    found: set[Route] = set()
    candidates = [(prefix, route) for router, prefix in ROUTERS for route in router.routes]
    candidates += [("", route) for route in app.routes]
    for prefix, route in candidates:
        path, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if path is not None and methods:
            found |= {(method, prefix + path) for method in methods if method != "HEAD"}
    return found


def schema_statuses(app: FastAPI) -> dict[Route, set[int]]:
    return {(method.upper(), path): {int(code) for code in operation["responses"]}
            for path, operations in app.openapi()["paths"].items() for method, operation in operations.items()}


def _codes(cell: str) -> set[int]:
    return {int(code) for code in re.findall(r"\b[1-5]\d\d\b", cell)}


def documented_endpoints(text: str) -> dict[Route, set[int]]:
    return {(code_spans(row["method"])[0], code_spans(row["path"])[0]): _codes(row["status codes"])
            for row in table(text, "Endpoints", "method", "path", "status codes").rows}


ROUTE_MENTION = re.compile(r"\b(GET|PUT|POST|DELETE|PATCH) (/[\w/{}.-]*)")
# The engines' own OpenAI-compatible servers, which docs/bench_serve.md, vllm.md and sglang.md also name
ENGINE_SERVER_PATHS = ("/v1/models", "/v1/completions", "/v1/chat/completions")


def api_differences(text: str, routes: set[Route], statuses: dict[Route, set[int]]) -> list[str]:
    out = []
    endpoints = documented_endpoints(text)
    for route in sorted(set(endpoints) | routes):
        name = " ".join(route)
        if route not in routes:
            out.append(f"{name}: documented, but the app serves no such route")
        elif route not in endpoints:
            out.append(f"{name}: served, not in the Endpoints table")
        elif route in statuses and endpoints[route] != statuses[route]:
            out.append(f"{name}: documented statuses {sorted(endpoints[route])}, the schema's "
                       f"{sorted(statuses[route])}")
    any_route = {int(row["status"]) for row in table(text, "Errors", "status", "on any route").rows}
    for t in tables(text):  # an endpoint's own status table: its schema's statuses, plus any route's
        heading = ROUTE_MENTION.search(t.heading)
        if heading is None or t.header[:1] != ("status",):
            continue
        route = (heading.group(1), heading.group(2))
        listed = set().union(*(_codes(row["status"]) for row in t.rows))
        expected = statuses.get(route, set())
        if not expected <= listed or not listed <= expected | any_route:
            out.append(f"{' '.join(route)} status table: {sorted(listed)}, the schema's {sorted(expected)} "
                       f"(any route's: {sorted(any_route)})")
    return out


def unknown_route_mentions(text: str, routes: set[Route]) -> list[str]:
    """`METHOD /path` mentions (query strings left off) that name no served route; `GET /v1/…` names a prefix."""
    mentions = {(method, path.rstrip(".")) for method, path in ROUTE_MENTION.findall(text)}  # a sentence's stop
    return sorted(f"{method} {path}" for method, path in mentions
                  if (method, path) not in routes and path not in ENGINE_SERVER_PATHS and not path.endswith("/")
                  and path.startswith(("/v1", "/healthz", "/readyz", "/metrics")))


def test_the_endpoints_are_the_apps(app: FastAPI) -> None:
    assert api_differences(read(DOC), served_routes(app), schema_statuses(app)) == []


def test_every_route_the_docs_name_is_served(app: FastAPI) -> None:
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        assert unknown_route_mentions(Path(doc).read_text(encoding="utf-8"), served_routes(app)) == [], doc.name


def test_a_planted_status_route_and_mention_are_found(app: FastAPI) -> None:
    text, routes, statuses = read(DOC), served_routes(app), schema_statuses(app)
    wrong_status = text.replace("| `GET` | `/v1/mode` | 200, 409 |", "| `GET` | `/v1/mode` | 200, 404 |")
    assert api_differences(wrong_status, routes, statuses) == [
        "GET /v1/mode: documented statuses [200, 404], the schema's [200, 409]"]
    assert api_differences(text.replace("| `GET` | `/v1/stats` | 200 |", "| `GET` | `/v1/statistics` | 200 |"),
                           routes, statuses) == ["GET /v1/statistics: documented, but the app serves no such route",
                                                 "GET /v1/stats: served, not in the Endpoints table"]
    assert unknown_route_mentions("then `DELETE /v1/mode` and `GET /v1/mode`", routes) == ["DELETE /v1/mode"]


def test_a_planted_status_in_an_endpoints_own_table_is_found(app: FastAPI) -> None:
    text = read(DOC)
    assert "| 413 | body above 64 KiB |" in text
    assert api_differences(text.replace("| 413 | body above 64 KiB |", "| 418 | body above 64 KiB |"),
                           served_routes(app), schema_statuses(app)) == [
        "PUT /v1/mode status table: [200, 202, 401, 403, 409, 418, 422], the schema's [200, 202, 401, 403, 409, 422] "
        "(any route's: [400, 413])"]
