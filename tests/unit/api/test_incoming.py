"""IncomingBodies on a small falcon app, driven through hand-made ASGI channels: a body that stops or dribbles is a 408
in the route's dialect with `Connection: close`, bodies past the budget are refused at once with 503, a body that
arrives in time passes untouched, and every request leaves the count of bodies arriving as it found it. (The real
sockets against the real daemon: tests/integration/test_slow_clients.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import falcon
import falcon.asgi
import orjson
import pytest

from blazar.api import errors
from blazar.api.incoming import IncomingBodies, has_body


class _Echo:
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"got": await req.get_media()}


class _Raw:
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"bytes": len(await req.stream.read())}


def _app() -> falcon.asgi.App:
    api = falcon.asgi.App()
    api.req_options.default_media_type = falcon.MEDIA_JSON
    errors.register(api)
    api.add_route("/v1/echo", _Echo())
    api.add_route("/v1/messages", _Raw())
    api.add_route("/api/chat", _Raw())
    return api


def _scope(path: str, *, length: int | None = None, chunked: bool = False) -> dict[str, Any]:
    headers = [(b"host", b"localhost"), (b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
            "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 11435)}


class _Client:
    """A client's side of one request: body chunks given with the pause before each (None: never sends more)."""

    def __init__(self, chunks: Iterable[tuple[float | None, bytes]]) -> None:
        self.chunks = list(chunks)
        self.sent: list[dict[str, Any]] = []
        self.reads = 0

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if not self.chunks:
            await asyncio.Event().wait()  # the body is over: a later read waits for a disconnect that never comes
        pause, data = self.chunks.pop(0)
        if pause is None:
            await asyncio.Event().wait()
        await asyncio.sleep(pause or 0)
        return {"type": "http.request", "body": data, "more_body": bool(self.chunks)}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode().lower(): v.decode() for k, v in self.sent[0]["headers"]}

    @property
    def body(self) -> Any:
        return orjson.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))


def _wrapped(*, idle_s: float = 0.2, total_s: float = 1.0, limit: int = 8) -> IncomingBodies:
    return IncomingBodies(_app(), idle_s=idle_s, total_s=total_s, limit=limit)


async def _call(wrapper: IncomingBodies, path: str, client: _Client, **scope: Any) -> _Client:
    await asyncio.wait_for(wrapper(_scope(path, **scope), client.receive, client.send), 10)
    return client


async def test_a_body_in_time_passes_untouched() -> None:
    wrapper = _wrapped()
    client = await _call(wrapper, "/v1/echo", _Client([(0, b'{"a": '), (0.05, b'1}')]), length=8)
    assert client.status == 200 and client.body == {"got": {"a": 1}}
    assert wrapper.receiving == 0


async def test_a_body_that_stops_arriving_is_408_with_connection_close() -> None:
    wrapper = _wrapped(idle_s=0.1)
    client = await _call(wrapper, "/v1/echo", _Client([(0, b'{"a": '), (None, b"")]), length=100)
    assert client.status == 408
    assert client.headers["connection"] == "close"
    assert client.body["error"]["code"] == "request_timeout"
    assert "body_idle_timeout_s" in client.body["error"]["message"]
    assert wrapper.receiving == 0


async def test_headers_with_no_body_at_all_are_a_408_too() -> None:
    wrapper = _wrapped(idle_s=0.1)
    client = await _call(wrapper, "/v1/echo", _Client([(None, b"")]), length=100)
    assert client.status == 408


@pytest.mark.parametrize(("path", "shape"), [
    ("/v1/messages", lambda b: b["type"] == "error" and "body_timeout_s" in b["error"]["message"]),
    ("/api/chat", lambda b: "body_timeout_s" in b["error"]),
])
async def test_a_body_dribbled_past_the_whole_body_limit_is_408_in_the_routes_dialect(path: str, shape: Any) -> None:
    wrapper = _wrapped(idle_s=0.2, total_s=0.5)
    client = await _call(wrapper, path, _Client([(0.05, b" ")] * 100), length=100)
    assert client.status == 408
    assert shape(client.body)
    assert wrapper.receiving == 0


async def test_bodies_past_the_budget_are_refused_at_once_and_the_budget_frees_up() -> None:
    wrapper = _wrapped(idle_s=5, total_s=5, limit=2)
    slow = [_Client([(0, b"{"), (None, b"")]) for _ in range(2)]
    held = [asyncio.create_task(_call(wrapper, "/v1/echo", c, length=10)) for c in slow]
    await asyncio.sleep(0.05)
    assert wrapper.receiving == 2
    refused = await _call(wrapper, "/v1/echo", _Client([(0, b'{"a": 1}')]), length=8)
    assert refused.status == 503
    assert refused.headers["connection"] == "close" and refused.headers["retry-after"] == "1"
    assert "max_incoming_bodies" in refused.body["error"]["message"]
    assert refused.reads == 0  # refused before a byte of its body was read
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    assert wrapper.receiving == 0
    fine = await _call(wrapper, "/v1/echo", _Client([(0, b'{"a": 1}')]), length=8)
    assert fine.status == 200


async def test_a_chunked_body_counts_as_arriving() -> None:
    wrapper = _wrapped(idle_s=0.1)
    client = await _call(wrapper, "/v1/echo", _Client([(None, b"")]), chunked=True)
    assert client.status == 408


def test_only_requests_that_announce_a_body_are_watched() -> None:
    assert not has_body(_scope("/x"))
    assert not has_body(_scope("/x", length=0))
    assert has_body(_scope("/x", length=1))
    assert has_body(_scope("/x", chunked=True))


async def test_a_request_cancelled_while_its_body_arrives_is_cancelled_not_refused() -> None:
    wrapper = _wrapped(idle_s=5, total_s=5)
    client = _Client([(0, b"{"), (None, b"")])
    task = asyncio.create_task(_call(wrapper, "/v1/echo", client, length=10))
    await asyncio.sleep(0.05)
    assert wrapper.receiving == 1
    task.cancel()  # the client hung up, or the daemon is stopping
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.sent == [] and wrapper.receiving == 0


async def test_the_deadline_task_ends_once_no_body_is_arriving() -> None:
    wrapper = _wrapped(idle_s=0.2, total_s=1.0)
    await _call(wrapper, "/v1/echo", _Client([(0, b'{"a": 1}')]), length=8)
    for _ in range(50):
        if wrapper._sweeper is None:
            break
        await asyncio.sleep(0.02)
    assert wrapper._sweeper is None
