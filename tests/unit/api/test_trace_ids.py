"""A client's trace id is never reused, whenever the log saw it: RequestContext asks the log (`seen`) about an id a
client brings that memory does not know, claims it before asking, remembers its own fresh ids (their events may still
wait in the group-commit writer), and fails closed when the log cannot answer. (End to end across a restart:
tests/integration/test_trace_reuse.py.)"""

from __future__ import annotations

import asyncio

import falcon
import falcon.asgi
import falcon.testing
import httpx

from blazar.api.context import RequestContext

TRACE, PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


class Echo:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"trace_id": req.context.trace_id, "client_trace_id": req.context.client_trace_id}


class Log:
    """The log's `has_trace`: the ids it holds, and every id it was asked about."""

    def __init__(self, *held: str, fails: bool = False, gate: asyncio.Event | None = None) -> None:
        self.held, self.fails, self.gate, self.asked = set(held), fails, gate, []

    async def has_trace(self, trace_id: str) -> bool:
        self.asked.append(trace_id)
        if self.gate is not None:
            await self.gate.wait()
        if self.fails:
            raise OSError("disk I/O error")
        return trace_id in self.held


def _app(log: Log, known: frozenset[str] = frozenset()) -> falcon.asgi.App:
    app = falcon.asgi.App(middleware=[RequestContext(max_body_bytes=1024, known=known.__contains__,
                                                     seen=log.has_trace)])
    app.add_route("/echo", Echo())
    return app


def _get(app: falcon.asgi.App, **headers: str) -> dict[str, str | None]:
    return falcon.testing.TestClient(app).simulate_get("/echo", headers=headers).json


def test_an_id_the_log_holds_gets_a_fresh_one_and_is_kept_beside_it() -> None:
    log = Log("old-trace-0001")
    got = _get(_app(log), **{"x-blazar-trace-id": "old-trace-0001"})
    assert got["trace_id"] != "old-trace-0001" and got["client_trace_id"] == "old-trace-0001"
    assert log.asked == ["old-trace-0001"]


def test_a_traceparent_the_log_holds_gets_a_fresh_id_too() -> None:
    got = _get(_app(Log(TRACE)), traceparent=f"00-{TRACE}-{PARENT}-01")
    assert got["trace_id"] != TRACE


def test_a_new_id_is_kept_and_asked_about_once() -> None:
    log = Log()
    app = _app(log)
    assert _get(app, **{"x-blazar-trace-id": "new-trace-0001"})["trace_id"] == "new-trace-0001"
    assert _get(app, **{"x-blazar-trace-id": "new-trace-0001"})["trace_id"] != "new-trace-0001"  # remembered
    assert log.asked == ["new-trace-0001"]


def test_the_log_is_not_asked_about_ids_memory_knows_or_requests_without_one() -> None:
    log = Log()
    app = _app(log, known=frozenset({"recent-trace-01"}))
    assert _get(app, **{"x-blazar-trace-id": "recent-trace-01"})["trace_id"] != "recent-trace-01"
    _get(app)
    assert log.asked == []


def test_a_fresh_id_handed_out_is_not_reused_before_the_log_has_it() -> None:
    log = Log()  # the first request's events are still in the writer's buffer: the log does not hold them yet
    app = _app(log)
    fresh = _get(app)["trace_id"]
    assert fresh is not None
    assert _get(app, **{"x-blazar-trace-id": fresh})["trace_id"] != fresh


def test_when_the_log_cannot_answer_the_request_gets_a_fresh_id() -> None:
    got = _get(_app(Log(fails=True)), **{"x-blazar-trace-id": "maybe-old-0001"})
    assert got["trace_id"] != "maybe-old-0001" and got["client_trace_id"] == "maybe-old-0001"


async def test_two_requests_racing_with_one_new_id_do_not_both_get_it() -> None:
    gate = asyncio.Event()
    app = _app(Log(gate=gate))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        both = [asyncio.create_task(client.get("/echo", headers={"x-blazar-trace-id": "racing-trace-1"}))
                for _ in range(2)]
        await asyncio.sleep(0.05)  # both are in: the first is asking the log, the second found it claimed
        gate.set()
        ids = [(await t).json()["trace_id"] for t in both]
    assert sorted(i == "racing-trace-1" for i in ids) == [False, True]
