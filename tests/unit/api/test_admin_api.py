"""The admin routes against a fake supervisor: status codes, the OpenAI error shape, body validation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from blazar.api.app import create_app
from blazar.context import Blazar
from blazar.errors import BlazarError, ModelNotFound, ModelPinned, NoEngine
from blazar.events.instances import ModelCircuitOpened
from blazar.events.tuning import Posture
from blazar.instances.supervisor import UNSET, CircuitOpen, DoesNotFit, LoadFailed, ModelNotLoaded
from tests.support.asgi import LocalConductor as ASGIConductor
from tests.support.fakes import FakeSupervisor


@pytest.fixture
def sup() -> FakeSupervisor:
    return FakeSupervisor()


@pytest.fixture
async def client(app: Blazar, sup: FakeSupervisor) -> AsyncIterator[ASGIConductor]:
    async with ASGIConductor(create_app(app, sup)) as c:
        yield c


def _error(result: Any) -> dict:
    err = result.json["error"]
    assert set(err) == {"message", "type", "code", "param"}
    return err


async def test_health_answers_ok(client: ASGIConductor) -> None:
    r = await client.simulate_get("/health")
    assert r.status_code == 200
    assert r.json == {"status": "ok"}


async def test_ps_returns_supervisor_rows_and_open_circuits(app: Blazar, client: ASGIConductor,
                                                            sup: FakeSupervisor) -> None:
    sup.rows = [{"model": "m", "instance_id": "abc123", "state": "ready"}]
    await app.record(ModelCircuitOpened(model="bad", crashes=3, window_s=60, open_until=app.clock.now() + 300,
                                         last_exit_code=-4))
    r = await client.simulate_get("/api/blazar/ps")
    assert r.status_code == 200
    assert r.json == {"instances": sup.rows, "circuits": {"bad": app.clock.now() + 300}}


async def test_load_passes_parsed_keep_alive_pin_and_ctx(client: ASGIConductor, sup: FakeSupervisor) -> None:
    r = await client.simulate_post("/api/blazar/load", json={"model": "m", "keep_alive": "1h30m", "pin": True,
                                                              "ctx": 4096})
    assert r.status_code == 200
    assert r.json == {"instance_id": "abc123", "model": "m", "port": 40001, "slots": 2, "ctx_tokens": 4096,
                      "engine_tag": "b1234", "load_ms": 420, "embeddings": False, "rerank": False,
                      "kind": "llama-server", "posture": "defaults", "profile_seq": None}
    assert sup.calls == [("load", {"model": "m", "keep_alive": 5400.0, "pinned": True, "ctx": 4096})]


async def test_load_says_the_posture_the_instance_runs(client: ASGIConductor, sup: FakeSupervisor) -> None:
    sup.posture, sup.profile_seq = Posture(spec_type="ngram-simple", threads=2), 17
    r = await client.simulate_post("/api/blazar/load", json={"model": "m"})
    assert r.status_code == 200
    assert (r.json["posture"], r.json["profile_seq"]) == ("spec=ngram-simple t=2", 17)


async def test_load_ready_for_sessions_is_passed_on(client: ASGIConductor, sup: FakeSupervisor) -> None:
    r = await client.simulate_post("/api/blazar/load", json={"model": "m", "sessions": True})
    assert r.status_code == 200
    assert sup.calls[-1][1]["session"] is True
    bad = await client.simulate_post("/api/blazar/load", json={"model": "m", "sessions": "yes"})
    assert bad.status_code == 400


@pytest.mark.parametrize(("given", "expected"), [(-1, None), ("-1", None), (0, 0.0), (300, 300.0), ("45s", 45.0)])
async def test_load_keep_alive_forms(client: ASGIConductor, sup: FakeSupervisor, given: Any, expected: Any) -> None:
    r = await client.simulate_post("/api/blazar/load", json={"model": "m", "keep_alive": given})
    assert r.status_code == 200
    assert sup.calls[0][1]["keep_alive"] == expected


async def test_load_without_keep_alive_or_pin_leaves_them_to_the_supervisor(client: ASGIConductor,
                                                                            sup: FakeSupervisor) -> None:
    r = await client.simulate_post("/api/blazar/load", json={"model": "m"})
    assert r.status_code == 200
    assert sup.calls == [("load", {"model": "m", "keep_alive": UNSET, "pinned": None, "ctx": None})]


async def test_bad_json_is_400_invalid_json_and_calls_nothing(client: ASGIConductor, sup: FakeSupervisor) -> None:
    r = await client.simulate_post("/api/blazar/load", body=b"{not json",
                                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = _error(r)
    assert err["type"] == "invalid_request_error"
    assert err["code"] == "invalid_json"
    assert sup.calls == []


async def test_empty_body_is_400(client: ASGIConductor) -> None:
    r = await client.simulate_post("/api/blazar/stop", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert _error(r)["code"] == "invalid_json"


async def test_unknown_field_is_400_naming_it(client: ASGIConductor, sup: FakeSupervisor) -> None:
    r = await client.simulate_post("/api/blazar/load", json={"model": "m", "keepalive": "5m"})
    assert r.status_code == 400
    err = _error(r)
    assert err["code"] == "invalid_request"
    assert err["param"] == "keepalive"
    assert "keepalive" in err["message"]
    assert sup.calls == []


async def test_bad_keep_alive_is_400_with_the_accepted_forms(client: ASGIConductor, sup: FakeSupervisor) -> None:
    r = await client.simulate_post("/api/blazar/load", json={"model": "m", "keep_alive": "5x"})
    assert r.status_code == 400
    err = _error(r)
    assert err["code"] == "invalid_request"
    assert err["param"] == "keep_alive"
    assert "5x" in err["message"] and "5m" in err["message"]
    assert sup.calls == []


@pytest.mark.parametrize("body", [{"model": "m", "keep_alive": True}, {"model": "m", "ctx": 0}, {"model": ""},
                                  {}, ["m"], {"model": "m", "pin": "maybe"}])
async def test_invalid_bodies_are_400(client: ASGIConductor, sup: FakeSupervisor, body: Any) -> None:
    r = await client.simulate_post("/api/blazar/load", json=body)
    assert r.status_code == 400
    assert _error(r)["code"] == "invalid_request"
    assert sup.calls == []


@pytest.mark.parametrize(("exc", "status", "code"), [
    (ModelNotFound("no model named 'x'"), 404, "model_not_found"),
    (ModelNotLoaded("x is not loaded"), 404, "model_not_loaded"),
    (CircuitOpen("x crashed 3 times; blazar ps --reset x"), 503, "circuit_open"),
    (DoesNotFit("needs 9 GB, 2 GB free"), 507, "insufficient_memory"),
    (ModelPinned("x is pinned at 512 tokens per slot and 1024 were asked for"), 409, "model_pinned"),
    (LoadFailed("x exited (load_failed)"), 502, "load_failed"),
    (NoEngine(), 503, "no_engine"),
    (BlazarError("something else"), 500, "internal_error"),
])
async def test_supervisor_errors_map_to_status_and_code(client: ASGIConductor, sup: FakeSupervisor,
                                                        exc: Exception, status: int, code: str) -> None:
    sup.fail = exc
    r = await client.simulate_post("/api/blazar/load", json={"model": "x"})
    assert r.status_code == status
    err = _error(r)
    assert err["code"] == code
    assert err["message"] == str(exc)
    assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error")


async def test_unexpected_exception_is_500_internal_error(client: ASGIConductor, sup: FakeSupervisor) -> None:
    sup.fail = RuntimeError("boom")
    r = await client.simulate_post("/api/blazar/stop", json={"model": "x"})
    assert r.status_code == 500
    err = _error(r)
    assert err["code"] == "internal_error"
    assert "boom" in err["message"]


async def test_stop_and_reset(client: ASGIConductor, sup: FakeSupervisor) -> None:
    r = await client.simulate_post("/api/blazar/stop", json={"model": "m"})
    assert (r.status_code, r.json) == (200, {"stopped": ["abc123"]})
    r = await client.simulate_post("/api/blazar/reset", json={"model": "m"})
    assert (r.status_code, r.json) == (200, {"reset": True})
    assert sup.calls == [("stop", {"model": "m"}), ("reset", {"model": "m"})]


async def test_unknown_route_and_wrong_method_render_in_the_same_shape(client: ASGIConductor) -> None:
    r = await client.simulate_get("/api/blazar/nope")
    assert r.status_code == 404
    assert _error(r)["code"] == "not_found"
    r = await client.simulate_get("/api/blazar/load")
    assert r.status_code == 405
    assert _error(r)["code"] == "method_not_allowed"
    assert "POST" in r.headers["allow"]
