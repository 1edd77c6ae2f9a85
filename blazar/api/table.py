"""The route table: every route the daemon serves, each declared once in its own api module (`ROUTES`, blazar/api/
routes.py says what a route is). `create_app` adds them, auth reads each one's access (`access_rules`), and the
OpenAPI document renders them; tests/unit/api/test_route_walk.py checks that falcon serves exactly these."""

from __future__ import annotations

from blazar.api import (
    admin,
    anthropic,
    audio,
    batches,
    console,
    dashboard,
    files,
    ollama,
    ollama_chat,
    ollama_create,
    ollama_pull,
    openai,
    openapi,
    ops,
    realtime,
    rerank,
    responses,
    sessions,
)
from blazar.api.auth import Access
from blazar.api.routes import Op, Route
from blazar.api.schemas import OBJ

_DOCUMENT = Route("/openapi.json", Access.OPEN, lambda d: openapi.OpenAPIResource(d.routes),
                  {"get": Op("This document", OBJ)})  # describes the routes: no secret in it

ROUTES: tuple[Route, ...] = (
    *ops.ROUTES, *admin.ROUTES, *dashboard.ROUTES, *console.ROUTES, *sessions.ROUTES,
    *openai.ROUTES, *responses.ROUTES, *files.ROUTES, *batches.ROUTES, *audio.ROUTES, *rerank.ROUTES,
    *realtime.ROUTES,
    *anthropic.ROUTES,
    *ollama.ROUTES, *ollama_chat.ROUTES, *ollama_pull.ROUTES, *ollama_create.ROUTES,
    _DOCUMENT,
)


def access_rules(routes: tuple[Route, ...] = ROUTES) -> dict[str, Access]:
    """Who may call each route, by URI template (auth's rule; a template missing is ADMIN)."""
    return {route.path: route.access for route in routes}
