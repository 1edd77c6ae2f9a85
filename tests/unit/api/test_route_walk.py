"""One decision per request, on the route that will serve it. Every route of the OpenAPI document, by every method
it documents, is called on its canonical path and on each variant a router or a server might read differently
(`//x`, `///x`, `/./x`, a doubled inner slash, a trailing slash, percent-encoded slashes as the server delivers
them: decoded, `..` and `.` segments), by every kind of caller: each answer is what the canonical path gets for that
caller, or 404 with a trace id, in the route's dialect, that no handler saw; a caller that is not an admin is never
served by an admin route. The handlers are replaced by recorders, so what is checked is the decision alone: the real
middleware, router and rules. Also: every route has a rule, and one without is admin-only."""

from __future__ import annotations

import posixpath
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import falcon.asgi
import pytest

from blazar.api import auth, paths, table
from blazar.api.app import create_app
from blazar.context import Blazar
from blazar.operations import keys
from tests.support.asgi import LocalConductor
from tests.support.fakes import FakeGateway, FakeSupervisor

TOKEN = "blzadm_the-daemons-token"
CLUSTER = "cluster-secret-0123456789abcdef-0123456789"
# Written here, not read from blazar/api/auth.py: what each route must be, whatever the table says.
OPEN = frozenset({"/health", "/openapi.json", "/console", "/console/static/{name}"})
ADMIN = frozenset({"/api/delete", "/api/copy", "/api/create", "/metrics", "/ready"})
# Under /api/blazar/ but any key's: a key's own sessions (the handlers show and touch nothing else).
KEYS_OWN = frozenset({"/api/blazar/sessions", "/api/blazar/sessions/{name}", "/api/blazar/sessions/{name}/save",
                      "/api/blazar/sessions/{name}/restore"})
CLUSTER_MAY = frozenset({"/api/pull"})
# Plausible values for the path parameters.
PARAMS = {"name": "chat-1", "trace": "0123456789abcdef0123456789abcdef", "model_id": "gemma3",
          "response_id": "resp_0123456789abcdef", "file_id": "file-0123456789abcdef01234567",
          "batch_id": "batch_0123456789abcdef01234567"}
STATIC_NAME = "console.js"


def admin_route(template: str) -> bool:
    return (template.startswith("/api/blazar/") and template not in KEYS_OWN) or template in ADMIN \
        or template in CLUSTER_MAY


def fill(template: str) -> str:
    if template == "/console/static/{name}":
        return f"/console/static/{STATIC_NAME}"
    return re.sub(r"{(\w+)}", lambda m: PARAMS[m[1]], template)


def variants(template: str) -> Iterator[str]:
    """What a client may send for the route `template` (as falcon's test client takes it: percent-encoded bytes are
    decoded into the ASGI path, as granian does)."""
    path = fill(template)
    yield "/" + path  # //x
    yield "//" + path  # ///x
    yield "/." + path  # /./x
    yield "/nope/.." + path  # /nope/../x
    last = path.rfind("/")
    yield path[:last] + "/" + path[last:]  # the last slash doubled
    if path != "/":
        yield path + "/"
        yield path + "/."
    yield "/" + path.replace("/", "%2F")  # /%2Fapi%2Fblazar%2Fps: delivered as //api/blazar/ps
    yield path[:1] + path[1:].replace("/", "%2F")  # /api%2Fblazar%2Fps: delivered as the canonical path
    for value in ("..", ".", ""):  # a path parameter falcon would match with a dot segment or nothing
        for name in re.findall(r"{(\w+)}", template):
            yield fill(template.replace(f"{{{name}}}", value))


def dialect(template: str) -> str:
    if template.startswith("/v1/messages"):
        return "anthropic"
    return "ollama" if template.startswith("/api/") and not template.startswith("/api/blazar/") else "openai"


def shape(body: Any) -> str:
    """The dialect an error body is in."""
    if isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict):
        return "anthropic"
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return "ollama"
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    return "openai"


@dataclass
class Walk:
    client: LocalConductor
    callers: dict[str, dict[str, str]]
    doc: dict[str, Any]
    reached: list[tuple[str, str, Any]] = field(default_factory=list)

    def since(self, before: int) -> list[tuple[str, str]]:
        """(route, method) of each handler reached since `before`."""
        return [(t, m) for t, m, _ in self.reached[before:]]

    async def call(self, method: str, path: str, caller: str) -> Any:
        body = {"json": {}} if method in ("post", "delete", "put", "patch") else {}
        return await self.client.simulate_request(method.upper(), path, headers=dict(self.callers[caller]), **body)


def nodes(api: falcon.asgi.App) -> Iterator[Any]:
    def walk(items: list[Any]) -> Iterator[Any]:
        for node in items:
            if node.resource is not None:
                yield node
            yield from walk(node.children)

    yield from walk(api._router._roots)


def record_instead_of_handling(api: falcon.asgi.App, reached: list[tuple[str, str, Any]]) -> None:
    """Every responder, falcon's default OPTIONS one included, becomes a recorder of (route, method, principal)."""
    for node in nodes(api):
        for method in list(node.method_map):
            async def recorder(req: falcon.asgi.Request, resp: falcon.asgi.Response, _t: str = node.uri_template,
                               _m: str = method, **params: Any) -> None:
                reached.append((_t, _m, auth.principal_of(req)))
                resp.media = {"reached": _t}

            node.method_map[method] = recorder


@pytest.fixture
async def walk(app: Blazar) -> AsyncIterator[Walk]:
    app.node = "n1"  # one node of a cluster: the cluster key counts
    app.env = {**app.env, "BLAZAR_CLUSTER_KEY": CLUSTER}
    api = create_app(app, FakeSupervisor(), cast(Any, FakeGateway()), admin_token=TOKEN)
    _, scoped = await keys.create(app, "scoped", models=["gemma*"])
    _, wide = await keys.create(app, "wide")
    _, root = await keys.create(app, "root", admin=True)
    callers = {"no key": {}, "scoped key": {"Authorization": f"Bearer {scoped}"},
               "unscoped key": {"Authorization": f"Bearer {wide}"}, "admin key": {"x-api-key": root},
               "admin token": {"Authorization": f"Bearer {TOKEN}"},
               "cluster key": {"Authorization": f"Bearer {CLUSTER}"}}
    async with LocalConductor(api) as c:
        w = Walk(c, callers, (await c.simulate_get("/openapi.json")).json)
        record_instead_of_handling(api, w.reached)
        yield w


def admin_may(template: str, caller: str) -> bool:
    """Whether `caller` may call the admin route `template`."""
    return caller in ("admin key", "admin token") or (caller == "cluster key" and template in CLUSTER_MAY)


def expected(template: str, method: str, caller: str) -> int:
    if template in OPEN or method == "options":
        return 200
    if caller == "no key":
        return 401
    return 403 if admin_route(template) and not admin_may(template, caller) else 200


async def test_every_route_by_every_caller_answers_as_its_canonical_path_or_404(walk: Walk) -> None:
    doc = walk.doc
    assert len(doc["paths"]) >= 40
    checked = 0
    for template, ops in doc["paths"].items():
        for method in ops:
            for caller in walk.callers:
                canonical = fill(template)
                before = len(walk.reached)
                base = await walk.call(method, canonical, caller)
                want = expected(template, method, caller)
                assert base.status_code == want, (method, canonical, caller, base.text)
                assert walk.since(before) == ([(template, method.upper())] if want == 200 else [])
                for path in variants(template):
                    before = len(walk.reached)
                    r = await walk.call(method, path, caller)
                    where = (method, path, caller, r.status_code)
                    assert r.status_code in (base.status_code, 404), where
                    assert r.headers.get("x-blazar-trace-id"), where
                    if admin_route(template) and method != "options" and not admin_may(template, caller):
                        assert r.status_code in (401, 403, 404), where
                    # Served: by exactly the route whose rule it got. Refused: no handler saw it.
                    assert walk.since(before) == ([(template, method.upper())] if r.status_code == 200 else []), where
                    names_route = posixpath.normpath("/" + path.replace("%2F", "/").lstrip("/")) == canonical
                    if r.status_code >= 400 and method != "head" and names_route:
                        assert shape(r.json) == dialect(template), where
                    checked += 1
    assert checked > 3000
    for template, method, principal in walk.reached:  # who each admin route served
        if admin_route(template) and method != "OPTIONS":
            assert principal.admin or (principal.cluster and template in CLUSTER_MAY), (template, principal)


async def test_a_non_canonical_path_is_404_before_any_other_decision(walk: Walk) -> None:
    """Not 401 for want of a key, nor 403 for a foreign Host: no decision is made on a path no route serves."""
    for path in ("//api/delete", "/api/delete/", "/./api/delete", "/api/blazar/sessions/../save"):
        r = await walk.client.simulate_delete(path, json={"model": "x"}, headers={"Host": "rebind.example"})
        assert r.status_code == 404 and r.headers["x-blazar-trace-id"], path
    r = await walk.client.simulate_get("//v1/messages")
    assert r.status_code == 404 and r.json["type"] == "error" and r.json["error"]["type"] == "not_found_error"
    assert "'//v1/messages'" in r.json["error"]["message"]
    assert walk.reached == []


@pytest.mark.parametrize(("path", "dialect_of"), [("/v1/nope", "openai"), ("/v1/messages/nope", "anthropic"),
                                                  ("/api/nope", "ollama"), ("/api/blazar/nope", "openai"),
                                                  ("/nope", "openai")])
async def test_a_request_no_route_serves_is_404_in_its_dialect_whoever_calls(walk: Walk, path: str,
                                                                              dialect_of: str) -> None:
    for caller in walk.callers:
        r = await walk.call("post", path, caller)
        assert r.status_code == 404 and r.headers["x-blazar-trace-id"]
        assert shape(r.json) == dialect_of
    assert walk.reached == []


# -- the rules ------------------------------------------------------------------------------------------------------

def served(api: falcon.asgi.App) -> set[str]:
    return {node.uri_template for node in nodes(api)}


async def test_every_route_served_is_one_entry_of_the_table_and_every_entry_is_served(app: Blazar) -> None:
    routes = served(create_app(app, FakeSupervisor(), cast(Any, FakeGateway())))
    declared = [route.path for route in table.ROUTES]
    assert len(declared) == len(set(declared)), "a route declared twice in the table (blazar/api/table.py)"
    assert routes - set(declared) == set(), "routes served that the table does not declare"
    assert set(declared) - routes == set(), "routes declared that are not served"
    rules = table.access_rules()
    assert {r for r, rule in rules.items() if rule is auth.Access.OPEN} == OPEN
    assert {r for r in routes if admin_route(r)} == {r for r, rule in rules.items()
                                                     if rule in (auth.Access.ADMIN, auth.Access.CLUSTER)}


async def test_without_a_gateway_only_the_routes_that_need_none_are_served(app: Blazar) -> None:
    routes = served(create_app(app, FakeSupervisor()))
    assert routes == {route.path for route in table.ROUTES if not route.needs_gateway}
    assert {"/health", "/api/blazar/ps", "/api/blazar/dashboard", "/console"} <= routes


async def test_a_route_added_without_a_rule_is_seen_and_is_admin_only(app: Blazar) -> None:
    class Extra:
        async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
            resp.media = {"ok": True}

    api = create_app(app, FakeSupervisor(), cast(Any, FakeGateway()))
    api.add_route("/v1/extra", Extra())
    assert served(api) - set(table.access_rules()) == {"/v1/extra"}  # what the test above would report
    _, user = await keys.create(app, "user")
    _, root = await keys.create(app, "root", admin=True)
    async with LocalConductor(api) as c:
        assert (await c.simulate_get("/v1/extra", headers={"x-api-key": user})).status_code == 403
        assert (await c.simulate_get("/v1/extra", headers={"x-api-key": root})).status_code == 200


@pytest.mark.parametrize(("path", "ok"), [("/", True), ("/api/delete", True), ("/console/static/.hidden", True),
                                          ("/api/blazar/why/a.b", True), ("", False), ("api/delete", False),
                                          ("//", False), ("//api/delete", False), ("/api//delete", False),
                                          ("/api/delete/", False), ("/./api", False), ("/api/.", False),
                                          ("/a/../api", False), ("/api/blazar/sessions/../save", False)])
def test_canonical_paths(path: str, ok: bool) -> None:
    assert paths.canonical(path) is ok


@pytest.mark.parametrize(("path", "normal"), [("//v1/messages", "/v1/messages"), ("/./api/tags/", "/api/tags"),
                                              ("/x/../v1/messages", "/v1/messages"), ("/..", "/"), ("", "/")])
def test_the_dialect_of_a_refused_path_is_read_from_its_normal_form(path: str, normal: str) -> None:
    assert paths.normalised(path) == normal
