"""The response cache on a request's way (blazar/serving/cache_step.py), with a fake pipeline behind it: which
requests may use it, a hit answered without the pipeline's way to the engine (and recorded as `request.cache_hit`),
never another tenant's entry, and a model whose identity moved misses and loses its old entries."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, cast

import pytest

from blazar.adapters.engines.client import Upstream
from blazar.events.base import Event
from blazar.serving.cache_step import ResponseCache, Stored
from blazar.serving.call import Call, Completed
from blazar.serving.request import Answer, Request
from blazar.serving.route import Route
from tests.support.resolved import resolved

BODY = {"model": "gemma", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
WHOLE = b'{"model":"gemma.gguf","choices":[{"message":{"content":"Hello"}}],"usage":{"completion_tokens":1}}'


@dataclass
class Desk:
    events: list[Event] = field(default_factory=list)

    def emit(self, event: Event, trace_id: str, actor: str | None = None) -> None:
        self.events.append(event)

    def release_slot(self, ticket: Any, *, tokens: int | None = None, charged: int | None = None) -> None: ...
    def give_back_slot(self, ticket: Any) -> None: ...
    def turn_done(self, call: Any, done: Any) -> None: ...
    def unhold(self, instance: Any) -> None: ...
    def release_lease(self, lease: Any) -> None: ...
    def charge(self, key_name: str, tokens: int) -> None: ...
    def charge_audio(self, key_name: str, seconds: float) -> None: ...


class Engine:
    """An engine's whole answer."""

    def __init__(self) -> None:
        self.closed = False

    @property
    def status_code(self) -> int:
        return 200

    @property
    def headers(self) -> Mapping[str, str]:
        return {"content-type": "application/json"}

    @property
    def is_closed(self) -> bool:
        return self.closed

    async def aiter_raw(self, heartbeat_s: float | None = None) -> AsyncIterator[bytes]:
        yield WHOLE

    async def aread(self) -> bytes:
        return WHOLE

    async def aclose(self) -> None:
        self.closed = True


class Pipeline:
    """The gateway's way past the cache: `run` asks the fake engine (through the cache's tap); `answer` reads an
    upstream whole, as the gateway does for a whole answer."""

    def __init__(self, cache: ResponseCache) -> None:
        self.cache, self.ran, self.answered = cache, 0, 0

    async def run(self, call: Call, watcher: asyncio.Task[None] | None) -> Answer:
        self.ran += 1
        return await self.answer(call, self.cache.tap(call, Engine()), watcher, {})

    async def answer(self, call: Call, upstream: Upstream, watcher: asyncio.Task[None] | None,
                     headers: dict[str, str]) -> Answer:
        self.answered += 1
        data = await upstream.aread()
        await upstream.aclose()
        call.finish(Completed(200, {"completion_tokens": 1}))
        return Answer(status=200, data=data, headers=headers, content_type="application/json")


def app(mib: int = 1) -> Any:
    return SimpleNamespace(
        log=SimpleNamespace(subscribe=lambda listener: (lambda: None)),
        settings=lambda: SimpleNamespace(routing=SimpleNamespace(
            response_cache_mib=mib, semantic_cache_model="", semantic_cache_threshold=0.95, semantic_cache_entries=0)),
        runner=SimpleNamespace(state=lambda name: SimpleNamespace(active=None, engines={}, models={})),
        clock=SimpleNamespace(now=lambda: 1000.0))


def call(trace: str, *, tenant: str | None = "key:a", cache: str | None = "use", sha: str = "aa" * 32,
         body: dict[str, Any] | None = None, **asked: Any) -> Call:
    request = Request(model="gemma", engine_path="/v1/chat/completions", body=body or BODY, stream=False,
                      trace_id=trace, tenant=tenant, cache=cache, path=asked.pop("path", "/v1/chat/completions"),
                      **asked)
    c = Call(request, Desk())
    c.take_route(Route("gemma", replace(resolved("gemma"), sha256=sha)))
    return c


def serve(cache: ResponseCache, pipeline: Pipeline, c: Call) -> Answer:
    return asyncio.run(cache.serve(c, None, pipeline))


def hits(c: Call) -> list[Event]:
    return [e for e in cast(Desk, c._desk).events if e.TYPE == "request.cache_hit"]


@pytest.mark.parametrize("what", [
    {"cache": None}, {"cache": "off"}, {"body": {**BODY, "temperature": 0.7}}, {"session": "key:a/chat"},
    {"best_of": 2}, {"cascade": ("a", "b")}, {"path": "/v1/responses"}, {"embeddings": True},
    {"sha": ""},  # a model with no recorded file identity
])
def test_what_may_not_use_the_cache_runs_its_way_and_is_never_kept(what: dict[str, Any]) -> None:
    cache = ResponseCache(cast(Any, app()))
    pipeline = Pipeline(cache)
    assert cache.plan(call("t0", **what)) is None
    answer = serve(cache, pipeline, call("t1", **what))
    assert "x-blazar-cache" not in answer.headers and len(cache.store) == 0 and pipeline.ran == 1


def test_a_miss_is_kept_and_the_same_request_is_then_a_hit_without_the_engine() -> None:
    cache = ResponseCache(cast(Any, app()))
    pipeline = Pipeline(cache)
    first = serve(cache, pipeline, call("t1"))
    assert first.headers["x-blazar-cache"] == "miss" and len(cache.store) == 1
    again = call("t2")
    answer = serve(cache, pipeline, again)
    assert pipeline.ran == 1  # the second never took the way to the engine
    assert answer.headers["x-blazar-cache"] == "hit; age=0.0" and answer.data == WHOLE
    [hit] = hits(again)
    assert hit.source == "exact" and len(hit.entry) == 64 and hit.age_s == 0.0  # type: ignore[attr-defined]
    assert isinstance(again.final(), Completed)


def test_an_entry_is_never_another_tenants_and_refresh_replaces_it() -> None:
    cache = ResponseCache(cast(Any, app()))
    pipeline = Pipeline(cache)
    serve(cache, pipeline, call("t1", tenant="key:a"))
    other = call("t2", tenant="key:b")
    assert serve(cache, pipeline, other).headers["x-blazar-cache"] == "miss" and not hits(other)
    assert serve(cache, pipeline, call("t3", tenant=None)).headers["x-blazar-cache"] == "miss"  # the owner's own
    assert serve(cache, pipeline, call("t4", cache="refresh")).headers["x-blazar-cache"] == "refresh"
    assert pipeline.ran == 4 and len(cache.store) == 3


def test_a_model_whose_file_changed_misses_and_its_old_entries_go() -> None:
    cache = ResponseCache(cast(Any, app()))
    pipeline = Pipeline(cache)
    serve(cache, pipeline, call("t1", sha="aa" * 32))
    assert serve(cache, pipeline, call("t2", sha="bb" * 32)).headers["x-blazar-cache"] == "miss"
    assert len(cache.store) == 1  # the old file's entry dropped, the new one kept


def test_a_stored_answer_is_played_back_under_the_clients_name() -> None:
    cache = ResponseCache(cast(Any, app()))
    pipeline = Pipeline(cache)
    serve(cache, pipeline, call("t1"))
    key = next(iter(cache.store._entries))
    entry = replace(cache.store._entries[key], served_as="gemma.gguf")
    from blazar.serving.relay import Rename

    body = asyncio.run(Stored(entry, Rename("gemma.gguf", "gemma")).aread())
    assert b'"model":"gemma"' in body and b"gemma.gguf" not in body
