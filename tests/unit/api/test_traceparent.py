"""The request's trace id with a W3C traceparent: a valid one is the request's parent and, while unused, its trace id
wins over x-blazar-trace-id (kept as client_trace_id); an invalid one is ignored, as the spec says."""

from __future__ import annotations

import falcon
import falcon.asgi
import falcon.testing
import pytest

from blazar.api.context import RequestContext, parse_traceparent

TRACE, PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.mark.parametrize("value", [
    f"00-{TRACE}-{PARENT}-01", f" 00-{TRACE}-{PARENT}-00 ", f"01-{TRACE}-{PARENT}-01-future-field"])
def test_a_valid_traceparent_gives_its_trace_and_parent(value: str) -> None:
    assert parse_traceparent(value) == (TRACE, PARENT)


@pytest.mark.parametrize("value", [
    None, "", f"00-{TRACE}-{PARENT}", f"ff-{TRACE}-{PARENT}-01", f"00-{'0' * 32}-{PARENT}-01",
    f"00-{TRACE}-{'0' * 16}-01", f"00-{TRACE.upper()}-{PARENT}-01", f"00-{TRACE}-{PARENT}-01-extra",
    f"00-{TRACE[:-1]}-{PARENT}-01"])
def test_an_invalid_traceparent_is_ignored(value: str | None) -> None:
    assert parse_traceparent(value) is None


class Echo:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"trace_id": req.context.trace_id, "client_trace_id": req.context.client_trace_id,
                      "traceparent": req.context.traceparent}


@pytest.fixture
def client() -> falcon.testing.TestClient:
    app = falcon.asgi.App(middleware=[RequestContext(max_body_bytes=1024)])
    app.add_route("/echo", Echo())
    return falcon.testing.TestClient(app)


def test_the_traceparents_trace_id_wins_and_the_clients_own_is_kept_beside_it(client) -> None:
    got = client.simulate_get("/echo", headers={"traceparent": f"00-{TRACE}-{PARENT}-01",
                                                "x-blazar-trace-id": "my-own-trace-1"})
    assert got.headers["x-blazar-trace-id"] == TRACE
    assert got.json == {"trace_id": TRACE, "client_trace_id": "my-own-trace-1", "traceparent": [TRACE, PARENT]}


def test_a_used_traceparent_trace_gets_a_fresh_id_and_keeps_its_parent(client) -> None:
    client.simulate_get("/echo", headers={"traceparent": f"00-{TRACE}-{PARENT}-01"})
    # The same distributed trace calls again: the log's trace id is fresh, the span still joins the client's trace.
    again = client.simulate_get("/echo", headers={"traceparent": f"00-{TRACE}-{PARENT}-01"}).json
    assert again["trace_id"] != TRACE and len(again["trace_id"]) == 32
    assert again["traceparent"] == [TRACE, PARENT]


def test_an_invalid_traceparent_leaves_the_x_blazar_trace_id_rule_alone(client) -> None:
    got = client.simulate_get("/echo", headers={"traceparent": "garbage", "x-blazar-trace-id": "my-own-trace-2"})
    assert got.json == {"trace_id": "my-own-trace-2", "client_trace_id": None, "traceparent": None}
