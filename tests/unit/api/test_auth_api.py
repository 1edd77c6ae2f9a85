"""The auth middleware in the assembled app (admin routes, a fake supervisor): open until a key exists, then 401 in the
caller's dialect with WWW-Authenticate, 403 for a non-admin key on an admin route, the CLI's admin token accepted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from blazar.api.app import create_app
from blazar.context import Blazar
from blazar.operations import keys as handlers
from tests.support.asgi import LocalConductor as ASGIConductor
from tests.support.fakes import FakeGateway, FakeSupervisor

TOKEN = "blzadm_the-daemons-token"
ROW = {"model": "gemma", "instance_id": "abc123", "state": "ready", "port": 40001}


@pytest.fixture
async def client(app: Blazar) -> AsyncIterator[ASGIConductor]:
    sup = FakeSupervisor()
    sup.rows = [dict(ROW)]
    # The dialects' routes are there (auth decides on the route resolved); nothing here reaches the gateway.
    async with ASGIConductor(create_app(app, sup, cast(Any, FakeGateway()), admin_token=TOKEN)) as c:
        yield c


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_without_a_key_every_route_is_open(client: ASGIConductor) -> None:
    r = await client.get("/api/blazar/ps")
    assert r.status_code == 200 and r.json["instances"][0]["port"] == 40001


async def test_with_a_key_no_secret_is_401_in_the_openai_shape_with_www_authenticate(app: Blazar,
                                                                                      client: ASGIConductor) -> None:
    await handlers.create(app, "alice")
    r = await client.get("/api/blazar/ps")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.headers["x-blazar-trace-id"]
    err = r.json["error"]
    assert err["code"] == "invalid_api_key" and err["type"] == "authentication_error"
    assert "blazar keys" in err["message"]
    assert (await client.get("/health")).status_code == 200


async def test_401_takes_the_anthropic_and_ollama_shapes_on_their_routes(app: Blazar, client: ASGIConductor) -> None:
    await handlers.create(app, "alice")
    r = await client.post("/v1/messages", json={}, headers={"x-api-key": "blz_wrong-wrong-wrong"})
    assert r.status_code == 401
    assert r.json["type"] == "error" and r.json["error"]["type"] == "authentication_error"
    r = await client.post("/api/chat", json={})
    assert r.status_code == 401 and isinstance(r.json["error"], str)


async def test_a_non_admin_key_is_403_on_admin_routes_and_an_admin_key_sees_the_port(app: Blazar,
                                                                                   client: ASGIConductor) -> None:
    _, user = await handlers.create(app, "alice")
    _, root = await handlers.create(app, "root", admin=True)
    r = await client.post("/api/blazar/load", json={"model": "gemma"}, headers=bearer(user))
    assert r.status_code == 403 and r.json["error"]["code"] == "admin_key_required"
    assert r.json["error"]["type"] == "permission_error"
    r = await client.get("/api/blazar/ps", headers={"x-api-key": root})
    assert r.status_code == 200 and r.json["instances"][0]["port"] == 40001


async def test_the_cli_admin_token_works_and_sync_folds_at_once(app: Blazar, client: ASGIConductor) -> None:
    await handlers.create(app, "alice")
    r = await client.get("/api/blazar/ps", headers=bearer(TOKEN))
    assert r.status_code == 200 and r.json["instances"][0]["port"] == 40001
    r = await client.post("/api/blazar/sync", json={}, headers=bearer(TOKEN))
    assert r.status_code == 200 and r.json["seq"] == await app.log.last_seq()
    assert (await client.get("/api/blazar/ps", headers=bearer(TOKEN[:-1]))).status_code == 401


async def test_revoking_every_key_opens_the_door_again(app: Blazar, client: ASGIConductor) -> None:
    await handlers.create(app, "alice")
    assert (await client.get("/api/blazar/ps")).status_code == 401
    await handlers.revoke(app, "alice")
    assert (await client.get("/api/blazar/ps")).status_code == 200


async def test_ollama_ps_shows_a_scoped_key_only_the_models_in_its_scope(app: Blazar) -> None:
    sup = FakeSupervisor()
    sup.rows = [dict(ROW), dict(ROW, model="qwen3", instance_id="def456", port=40002)]
    _, scoped = await handlers.create(app, "alice", models=["gemma*"])
    _, root = await handlers.create(app, "root", admin=True)
    async with ASGIConductor(create_app(app, sup, cast(Any, FakeGateway()))) as c:
        seen = {name: [m["name"] for m in (await c.get("/api/ps", headers=bearer(secret))).json["models"]]
                for name, secret in (("alice", scoped), ("root", root))}
    assert seen == {"alice": ["gemma"], "root": ["gemma", "qwen3"]}
