"""What reaches an engine child from the gateway: the real app, gateway and EngineClient in front of a stand-in child
(an HTTP server on loopback) that records each request's headers. Every request carries the child's own key and none of
the client's credentials (Authorization, x-api-key, cookies), in every dialect and for token counts too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDictProxy

from blazar.adapters.engines.client import EngineClient
from blazar.api.app import create_app
from blazar.context import Blazar
from blazar.instances.supervisor import Instance, ResolvedModel
from blazar.serving.admission import Admission
from blazar.serving.gateway import Gateway
from tests.support.resolved import resolved

CHILD_KEY = "eng_the_childs_own_key"
CLIENT_HEADERS = {"Authorization": "Bearer sk-client-secret", "x-api-key": "sk-client-secret",
                  "Cookie": "session=client-cookie"}
ANSWER = {"id": "c1", "object": "chat.completion", "model": "m", "created": 1,
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
CHUNKS = [{"id": "c1", "object": "chat.completion.chunk", "model": "m", "created": 1,
           "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]},
          {"id": "c1", "object": "chat.completion.chunk", "model": "m", "created": 1,
           "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
          {"id": "c1", "object": "chat.completion.chunk", "model": "m", "created": 1, "choices": [],
           "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}]


class Supervisor:
    """One warm instance, on the stand-in child's port, with a tiny context (so the gateway asks it to count)."""

    def __init__(self, port: int = 1) -> None:
        self.port = port

    def resolve(self, model: str) -> ResolvedModel:
        return resolved(model)

    async def ensure(self, model: ResolvedModel, **kw: Any) -> Instance:
        name = model.name
        return Instance(instance_id="i1", model=name, port=self.port, slots=1, ctx_tokens=64, engine_tag="t",
                        api_key=CHILD_KEY)

    def hold(self, inst: Instance) -> None:
        pass

    def unhold(self, inst: Instance) -> None:
        pass

    def ps(self) -> list[dict[str, Any]]:
        return []


class Child:
    """The stand-in child: records (path, headers) and answers like llama-server."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, CIMultiDictProxy[str]]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path, request.headers))
        if request.path.endswith("/input_tokens"):
            return web.json_response({"input_tokens": 3})
        if request.path == "/tokenize":
            return web.json_response({"tokens": [1, 2, 3]})
        if orjson.loads(await request.read()).get("stream"):
            sse = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in CHUNKS) + b"data: [DONE]\n\n"
            return web.Response(body=sse, content_type="text/event-stream")
        return web.json_response(ANSWER)


@pytest.fixture
def child() -> Child:
    return Child()


@pytest.fixture
async def child_port(child: Child) -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", child.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@pytest.fixture
async def client(app: Blazar, child_port: int) -> AsyncIterator[httpx2.AsyncClient]:
    """The app through httpx2's ASGI transport, which says `http.disconnect` only once the answer is complete (the
    gateway awaits a real child here, and falcon's conductor would report a hang-up while it does)."""
    engine = EngineClient()
    sup = Supervisor(child_port)
    gateway = Gateway(app, sup, Admission(), engine)  # type: ignore[arg-type]
    transport = httpx2.ASGITransport(app=create_app(app, sup, gateway))  # type: ignore[arg-type]
    try:
        async with httpx2.AsyncClient(transport=transport, base_url="http://localhost") as c:
            yield c
    finally:
        await engine.aclose()


REQUESTS = [
    ("/v1/chat/completions", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi " * 40}]}),
    ("/v1/chat/completions", {"model": "m", "max_tokens": 8, "stream": True,
                              "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"model": "m", "max_tokens": 8, "prompt": "hi " * 40}),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ("/api/chat", {"model": "m", "stream": False, "messages": [{"role": "user", "content": "hi"}]}),
    ("/api/generate", {"model": "m", "prompt": "hi"}),
]


@pytest.mark.parametrize(("route", "body"), REQUESTS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(REQUESTS)])
async def test_the_child_gets_its_own_key_and_none_of_the_clients_credentials(
        client: httpx2.AsyncClient, child: Child, route: str, body: dict[str, Any]) -> None:
    r = await client.post(route, json=body, headers=CLIENT_HEADERS)
    assert r.status_code == 200, r.text
    assert child.seen, "the request never reached the child"
    for path, headers in child.seen:
        assert headers.get("authorization") == f"Bearer {CHILD_KEY}", path
        assert "x-api-key" not in headers and "cookie" not in headers, path
        raw = str(list(headers.items()))
        assert "sk-client-secret" not in raw and "client-cookie" not in raw, path


async def test_a_long_prompt_is_counted_by_the_child_with_its_key(client: httpx2.AsyncClient, child: Child) -> None:
    await client.post("/v1/chat/completions", headers=CLIENT_HEADERS, json={
        "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi " * 40}]})
    paths = [p for p, _ in child.seen]
    assert paths == ["/v1/chat/completions/input_tokens", "/v1/chat/completions"]
