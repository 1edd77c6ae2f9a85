"""The OpenAPI document against the app itself: every route and method the router serves is documented and every
documented one is served; the document and each schema in it validate; it is served, open, at /openapi.json."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import falcon.asgi
import jsonschema
import pytest
import schemathesis

from blazar.api import auth, openapi, table
from blazar.api.app import create_app
from blazar.context import Blazar
from blazar.operations import keys
from tests.support.asgi import LocalConductor as ASGIConductor
from tests.support.fakes import FakeGateway, FakeSupervisor

METHODS = ("get", "head", "post", "put", "patch", "delete", "options")


def document() -> dict[str, Any]:
    return openapi.document(table.ROUTES)


def _app(app: Blazar) -> falcon.asgi.App:
    return create_app(app, FakeSupervisor(), cast(Any, FakeGateway()))


def served(api: falcon.asgi.App) -> set[tuple[str, str]]:
    """(path template, method) for every responder a resource defines, and OPTIONS, which falcon answers on every
    route (its default responder: the Allow header)."""
    out: set[tuple[str, str]] = set()

    def walk(nodes: list[Any]) -> Iterator[Any]:
        for node in nodes:
            if node.resource is not None:
                yield node
            yield from walk(node.children)

    for node in walk(api._router._roots):
        for method, responder in node.method_map.items():
            if getattr(responder, "__self__", None) is node.resource or method == "OPTIONS":
                out.add((node.uri_template, method.lower()))
    return out


def documented(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(path, m) for path, ops in doc["paths"].items() for m in ops if m in METHODS}


def test_every_served_route_is_documented_and_every_documented_one_is_served(app: Blazar) -> None:
    routes = served(_app(app))
    sockets = {(path, m) for path, m in routes if m == "websocket"}
    # A WebSocket has no HTTP method for the document to show: the table marks it so (`Route.websocket`).
    assert sockets == {(r.path, "websocket") for r in table.ROUTES if r.websocket}
    assert all(not r.ops for r in table.ROUTES if r.websocket)
    routes -= sockets
    doc = documented(document())
    assert routes - doc == set(), "served but not in the route table (blazar/api/table.py)"
    assert doc - routes == set(), "documented but not served"
    assert ("/v1/chat/completions", "post") in routes and ("/openapi.json", "get") in routes


def test_walking_the_router_sees_a_route_added_later(app: Blazar) -> None:
    """The check above fails when a route is added without documenting it."""

    class Extra:
        async def on_put(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None: ...

    api = _app(app)
    api.add_route("/api/blazar/extra", Extra())
    assert {("/api/blazar/extra", "put"), ("/api/blazar/extra", "options")} <= served(api) - \
        documented(document())


def test_the_document_validates_as_openapi_3_1_and_its_schemas_as_json_schema() -> None:
    doc = document()
    assert doc["openapi"].startswith("3.1")
    schemathesis.openapi.from_dict(doc).validate()  # the OpenAPI 3.1 meta-schema
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_a_broken_document_does_not_validate() -> None:
    doc = {**document(), "paths": {"/health": {"get": {"responses": {"200": {"description": 5}}}}}}
    with pytest.raises(Exception, match="not of type"):
        schemathesis.openapi.from_dict(doc).validate()


def test_every_request_body_is_its_routes_own_model() -> None:
    """A field added to a route's body model appears in the document without an edit elsewhere: each documented body
    is the model the route (or its dialect) validates with."""
    schemas = document()["components"]["schemas"]
    bodies = openapi.bodies(table.ROUTES)
    assert {"ChatBody", "MessagesBody", "ChatRequest", "GenerateRequest", "EmbedRequest", "ResponsesBody",
            "LoadBody", "PullBody"} <= set(bodies)
    for name, model in bodies.items():
        fields = {field.alias or name for name, field in model.model_fields.items()}
        assert set(schemas[name]["properties"]) == fields, name
    for path, ops in document()["paths"].items():
        for op in ops.values():
            ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            assert "$ref" not in ref or ref["$ref"].rsplit("/", 1)[1] in bodies, path


def test_every_operation_documents_its_dialects_error_shape() -> None:
    for path, ops in document()["paths"].items():
        want = {"anthropic": "AnthropicError", "ollama": "OllamaError", "openai": "OpenAIError"}[openapi.dialect(path)]
        for method, op in ops.items():
            for status, response in op["responses"].items():
                if status.startswith(("4", "5")) and not (path == "/ready" and status == "503"):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/" + want), (method, path, status)


async def test_served_at_openapi_json(app: Blazar) -> None:
    async with ASGIConductor(_app(app)) as c:
        r = await c.simulate_get("/openapi.json")
    assert r.status_code == 200
    assert r.json == document()
    assert r.json["paths"]["/openapi.json"]["get"]["security"] == []


async def test_the_document_stays_open_when_keys_are_on(app: Blazar) -> None:
    open_paths = {r.path for r in table.ROUTES if r.access is auth.Access.OPEN}
    assert open_paths == {"/health", "/openapi.json", "/console", "/console/static/{name}"}
    assert all(document()["paths"][p]["get"]["security"] == [] for p in open_paths)
    await keys.create(app, "ci")
    async with ASGIConductor(_app(app)) as c:
        assert (await c.simulate_get("/v1/models")).status_code == 401
        r = await c.simulate_get("/openapi.json")
    assert r.status_code == 200
    assert r.json["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
