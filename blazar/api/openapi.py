"""`GET /openapi.json`: an OpenAPI 3.1 document rendered from the route table (blazar/api/table.py): each route's
methods (blazar/api/routes.py `Op`), its access (an open route needs no key), its request body's own pydantic model
(the one the route or its dialect validates with, so the document cannot drift from what is accepted), the answers'
shapes (blazar/api/schemas.py). Nothing here describes a route: it only renders. tests/unit/api/test_openapi.py
walks the router to keep it true; tests/integration/test_schemathesis.py fuzzes the daemon against it."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import falcon
import falcon.asgi
from pydantic import BaseModel

import blazar
from blazar.api.auth import Access
from blazar.api.routes import Op, Route
from blazar.api.schemas import ANSWERS, JSON, NDJSON, OBJ, SSE, STR, Schema, ref

_PHRASES = {400: "the request is not valid (bad JSON, a field that does not validate)",
            401: "an API key is required (auth is on once a key exists)",
            403: "refused: the key's scope, a Host or Origin not allowed, or the hub's access",
            404: "no such model (or not loaded, or not on the hub)", 405: "method not allowed",
            408: "the body did not arrive in time (body_idle_timeout_s, body_timeout_s); the connection is closed",
            409: "the name is taken, the model is in use, or pinned in another shape",
            413: "the body is over max_body_mib",
            415: "the body is not JSON", 429: "a limit: the queue is full, or the key's rate (Retry-After)",
            502: "the engine (or the hub) failed",
            503: "no engine, an open circuit, the queue timed out, or too many bodies arriving "
                 "(server.max_incoming_bodies)",
            507: "the model does not fit in memory"}
_ERROR_SCHEMA = {"openai": "OpenAIError", "anthropic": "AnthropicError", "ollama": "OllamaError"}

# The statuses every route may answer besides its own (auth and the edge guards answer before the route runs).
_EDGE = (401, 403, 429)  # a key missing, out of scope, or over its limits
_BODY = (400, 408, 413, 415, 503)  # 408 and 503: blazar/api/incoming.py, before the route reads the body

# One server-sent event as schemathesis and clients read it; its data is the engine's (or the dialect's) chunk.
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"event": STR, "data": STR, "id": STR}}


def dialect(path: str) -> str:
    """Whose error shape a path answers in (blazar/api/errors.py renders by the same rule)."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "ollama" if path.startswith("/api/") and not path.startswith("/api/blazar/") else "openai"


def body_name(model: type[BaseModel]) -> str:
    """A body model's name in the document: its `title` where two modules' models share a class name."""
    title = model.model_config.get("title")
    return title if isinstance(title, str) else model.__name__


def body_schema(model: type[BaseModel]) -> Schema:
    """A pydantic model's own JSON schema (what it validates), less the titles pydantic adds to every field."""
    schema = model.model_json_schema()
    schema.pop("title", None)
    for props in schema.get("properties", {}).values():
        props.pop("title", None)
    return schema


def _content(op: Op) -> dict[str, Any]:
    """JSON answers take `ok`; an NDJSON stream's schema is that of each line (`line`, else `ok` or an error line);
    SSE, each event's."""
    out: dict[str, Any] = {}
    for t in op.ok_types:
        if t == JSON:
            out[t] = {"schema": op.ok or OBJ}
        elif t == NDJSON:
            out[t] = {"schema": {"description": "one JSON object a line",
                                 **(op.line or {"oneOf": [op.ok or OBJ, ref("OllamaError")]})}}
        elif t == SSE:
            out[t] = {"schema": _SSE_EVENT}
        elif t.startswith("audio/"):
            out[t] = {"schema": {"type": "string", "format": "binary"}}
        else:
            out[t] = {"schema": STR}
    return out


def _tag(path: str) -> str:
    return dialect(path) if path.startswith(("/v1", "/api/")) and not path.startswith("/api/blazar/") else "blazar"


def _operation(route: Route, method: str, op: Op) -> dict[str, Any]:
    """One operation: its 200 (JSON `ok`, or a stream, or text), its errors in the route's dialect."""
    error = ref(_ERROR_SCHEMA[dialect(route.path)])
    responses: dict[str, Any] = {"200": {"description": "OK", "content": _content(op)}
                                 if op.ok is not None or op.ok_types != (JSON,) else {"description": "OK"}}
    codes = set(op.statuses) | set(_EDGE) | (set(_BODY) if op.body is not None and op.body_required else set())
    for code in sorted(codes):
        responses[str(code)] = {"description": _PHRASES[code], "content": {JSON: {"schema": error}}}
    if op.engine_errors:
        # NOTE: the engine's own refusals (a sampling value it rejects) keep its status, in the caller's shape.
        responses["4XX"] = {"description": "the engine refused the request", "content": {JSON: {"schema": error}}}
    for code, answer in op.responses.items():
        responses[str(code)] = answer
    out: dict[str, Any] = {"summary": op.summary, "tags": [_tag(route.path)], "responses": responses,
                           "operationId": _operation_id(method, route.path)}
    if op.body is not None:
        media: dict[str, Any] = {"schema": ref(body_name(op.body))}
        if op.examples:
            media["examples"] = {f"example{i}": {"value": v} for i, v in enumerate(op.examples, 1)}
        out["requestBody"] = {"required": op.body_required, "content": {JSON: media}}
    elif op.form is not None:
        out["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": op.form}}}
    if route.access is Access.OPEN:
        out["security"] = []
        for code in _EDGE:
            responses.pop(str(code), None)
        responses["403"] = {"description": "a Host not allowed", "content": {JSON: {"schema": error}}}
    params = [{"name": n, "in": "path", "required": True, "schema": STR} for n in re.findall(r"{(\w+)}", route.path)]
    if params or op.parameters:
        out["parameters"] = [*params, *op.parameters]
    return out


def _operation_id(method: str, path: str) -> str:
    return f"{method}_{path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}" if path != "/" \
        else f"{method}_root"


def _paths(routes: Sequence[Route]) -> dict[str, dict[str, Any]]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        ops = {method: _operation(route, method, op) for method, op in route.ops.items()}
        # Falcon answers OPTIONS on every route (the methods it serves, in Allow).
        preflight = _operation(route, "options", Op("The methods this path serves (Allow); a CORS preflight"))
        preflight["security"] = []
        preflight["responses"]["204"] = {"description": "a CORS preflight answered"}
        paths[route.path] = {**ops, "options": preflight}
    return paths


def bodies(routes: Sequence[Route]) -> dict[str, type[BaseModel]]:
    """Every request body model of the table, by its name in the document (two models under one name fail)."""
    out: dict[str, type[BaseModel]] = {}
    for op in (op for route in routes for op in route.ops.values()):
        if op.body is not None:
            name = body_name(op.body)
            assert out.setdefault(name, op.body) is op.body, f"two request bodies named {name}: give one a title"
    return out


def _schemas(routes: Sequence[Route]) -> dict[str, Schema]:
    out = dict(ANSWERS)
    out.update((name, body_schema(model)) for name, model in bodies(routes).items())
    return out


@functools.cache
def document(routes: tuple[Route, ...]) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "Blazar", "version": blazar.__version__,
                 "description": "One gateway for local inference: the OpenAI, Anthropic and Ollama dialects, and "
                                "Blazar's own admin routes. Errors take the shape of the route's dialect."},
        "paths": _paths(routes),
        "components": {
            "schemas": _schemas(routes),
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "a Blazar key (blz_...)"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        # Auth is on only once a key exists (`blazar keys create`): until then no credential is needed.
        "security": [{}, {"bearerAuth": []}, {"apiKey": []}],
    }


class OpenAPIResource:
    def __init__(self, routes: tuple[Route, ...]) -> None:
        self.routes = routes

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = document(self.routes)
