"""The response cache on a request's way, after the caller's checks and the model's settings, before single-flight:
a request that uses the cache (blazar/serving/response_cache.py `cache_use`) and finds its entry is answered from
it, with no route, slot or engine; one that misses (or refreshes) runs the pipeline, and the engine's answer is
taped as it is relayed and kept once it is whole.

    Gateway.serve -> ResponseCache.serve -> hit:  the stored answer played back (`Stored`) -> Pipeline.answer
                                          -> miss: Pipeline.run (single-flight, the engine) -> `Tape` -> kept

A hit goes through the same relay and dialect conversion as a live answer (`Pipeline.answer`), so it is streamed, or
read whole, in the caller's dialect; its usage is the stored answer's (what making it cost). The answer says which
it was: `x-blazar-cache: hit; age=S`, `miss` or `refresh`; a hit is a `request.cache_hit` event. Where the key or
model is set to `semantic`, an exact miss asks blazar/serving/semantic_step.py for a similar prompt's entry
(`hit-semantic; similarity=S; age=A`), and a kept answer is kept with its prompt's vector.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from blazar.adapters.engines.answers import stream_error
from blazar.adapters.engines.client import Upstream
from blazar.events.base import Recorded
from blazar.events.models import ModelRemoved
from blazar.events.requests import RequestCacheHit
from blazar.projections.engines import active
from blazar.projections.profiles import profile
from blazar.serving.call import Call
from blazar.serving.relay import Rename
from blazar.serving.request import Answer, Request
from blazar.serving.response_cache import (
    CACHE_HEADER,
    AnswerStore,
    CacheUse,
    Entry,
    Identity,
    cache_key,
    cache_use,
    deterministic,
)
from blazar.serving.semantic_cache import Match, semantic_on
from blazar.serving.semantic_step import Probe, SemanticCache

if TYPE_CHECKING:
    from blazar.context import Blazar

RESPONSES = "/v1/responses"
MIB = 1 << 20


class Pipeline(Protocol):
    """What the cache needs of the gateway: a request's whole way (the semantic cache's internal embeddings
    request), the request's way on a miss, and an engine's answer as the client gets it."""

    async def serve(self, request: Request, watcher: asyncio.Task[None] | None = None) -> Answer: ...
    async def run(self, call: Call, watcher: asyncio.Task[None] | None) -> Answer: ...
    async def answer(self, call: Call, upstream: Upstream, watcher: asyncio.Task[None] | None,
                     headers: dict[str, str]) -> Answer: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """A request that uses the cache: how, and its entry's key."""

    use: CacheUse
    key: str
    identity: Identity
    semantic: bool = False  # a similar prompt's answer too (blazar/serving/semantic_step.py)


class ResponseCache:
    def __init__(self, app: Blazar) -> None:
        self.app = app
        self.store = AnswerStore(self._max_bytes())
        self.semantic = SemanticCache(app)
        # trace id -> the entry its engine's answer is taped for, and its prompt's vector (semantic)
        self._filling: dict[str, tuple[Plan, Probe | None]] = {}
        self._identities: dict[str, Identity] = {}  # a model's, as its last request found it
        self.unsubscribe = app.log.subscribe(self._on_commit)

    def _max_bytes(self) -> int:
        return self.app.settings().routing.response_cache_mib * MIB

    def _on_commit(self, batch: list[Recorded]) -> None:
        """A model removed (here) takes its entries with it."""
        for rec in batch:
            if isinstance(rec.event, ModelRemoved):
                self.store.drop_model(rec.event.name)
                self.semantic.index.drop_model(rec.event.name)

    # -- the step ------------------------------------------------------------------------------------------------------

    async def serve(self, call: Call, watcher: asyncio.Task[None] | None, pipeline: Pipeline) -> Answer:
        plan = self.plan(call)
        if plan is None:
            return await pipeline.run(call, watcher)
        if plan.use == "use":
            entry = self.store.get(plan.key)
            if entry is not None:
                return await self._hit(call, plan, entry, watcher, pipeline)
        probe = None
        if plan.semantic:  # exact first, then a similar prompt's answer (its vector kept with a new answer)
            probe = await self.semantic.probe(call, plan.identity, pipeline.serve, self.store.__contains__)
            found = self.store.get(probe.match.entry) if probe is not None and probe.match is not None else None
            if plan.use == "use" and found is not None and probe is not None and probe.match is not None:
                return await self._hit(call, plan, found, watcher, pipeline, probe.match)
            if plan.use == "use" and probe is not None:
                call.emit(probe.missed(call.trace_id, call.name or call.model))
        self._filling[call.trace_id] = (plan, probe)
        try:
            answer = await pipeline.run(call, watcher)
        finally:
            self._filling.pop(call.trace_id, None)
        said = "refresh" if plan.use == "refresh" else "miss"
        answer.headers[CACHE_HEADER] = f"{said}; {probe.said()}" if probe is not None else said
        return answer

    def plan(self, call: Call) -> Plan | None:
        """How `call` uses the cache, or None: not asked for, or not an answer the cache may give (one that depends on
        more than its body: a session's, a fan-out's, a Response with its own id, speech; or sampled at random)."""
        r, route = call.request, call.route
        key_setting = r.principal.key.cache if r.principal is not None and r.principal.key is not None else None
        model_setting = route.resolved.settings.cache if route.resolved.settings is not None else None
        use = cache_use(r.cache, key_setting, model_setting)
        if use is None or self.store.max_bytes <= 0:
            return None
        if (r.audio is not None or r.hooks.produce is not None or r.embeddings or r.rerank or r.session is not None
                or (r.best_of or 1) > 1 or r.cascade or r.path == RESPONSES or route.remote is not None
                or not route.resolved.sha256 or not deterministic(call.ask.engine_body())):
            return None
        identity = self._identity(call)
        key = cache_key(r.tenant, identity, r.engine_path, call.ask.engine_body(), stream=r.stream)
        semantic = semantic_on(key_setting, model_setting) and self.semantic.enabled()
        return None if key is None else Plan(use, key, identity, semantic)

    def _identity(self, call: Call) -> Identity:
        """The model's file, engine build, posture and template now; a model whose identity moved has its entries
        dropped (they can never be hit again)."""
        resolved = call.route.resolved
        engine = active(self.app.runner.state("engines"))
        adopted = profile(self.app.runner.state("profiles"), resolved.name)
        identity = Identity(model_sha256=resolved.sha256,
                            engine=f"{engine.tag}@{engine.installed_seq}" if engine is not None else "",
                            posture=f"profile@{adopted.seq}" if adopted is not None else "",
                            template=resolved.template)
        if self._identities.get(resolved.name, identity) != identity:
            self.store.drop_model(resolved.name)
        self._identities[resolved.name] = identity
        if self.store.max_bytes != self._max_bytes():
            self.store.bound(self._max_bytes())
        return identity

    async def _hit(self, call: Call, plan: Plan, entry: Entry, watcher: asyncio.Task[None] | None,
                   pipeline: Pipeline, similar: Match | None = None) -> Answer:
        age_s = max(0.0, self.app.clock.now() - entry.stored_at)
        if similar is None:
            call.emit(RequestCacheHit(trace_id=call.trace_id, model=call.name or call.model, source="exact",
                                      entry=plan.key, age_s=round(age_s, 3)))
            said = f"hit; age={age_s:.1f}"
        else:
            call.emit(RequestCacheHit(trace_id=call.trace_id, model=call.name or call.model, source="semantic",
                                      entry=similar.entry, age_s=round(age_s, 3),
                                      similarity=round(similar.similarity, 4)))
            said = f"hit-semantic; similarity={similar.similarity:.3f}; age={age_s:.1f}"
        rename = Rename(entry.served_as, call.model) if entry.served_as and entry.served_as != call.model else None
        return await pipeline.answer(call, Stored(entry, rename), watcher, {CACHE_HEADER: said})

    # -- the engine's answer, taped ------------------------------------------------------------------------------------

    def tap(self, call: Call, upstream: Upstream) -> Upstream:
        """`upstream` as it is, or taped for the entry `call` fills (a 200 only: a refusal is never kept)."""
        filling = self._filling.get(call.trace_id)
        if filling is None or upstream.status_code != 200:
            return upstream
        plan, probe = filling
        inst = call.instance
        served_as = inst.served_as if inst is not None else None
        name = call.name or call.model
        content_type = upstream.headers.get("content-type", "application/json")

        def keep(blocks: tuple[bytes, ...]) -> None:
            kept = self.store.put(plan.key, Entry(model=name, status=200, content_type=content_type,
                                                  stream=call.request.stream, blocks=blocks, served_as=served_as,
                                                  stored_at=self.app.clock.now()))
            if kept and probe is not None:
                self.semantic.keep(probe, plan.key, name)

        return Tape(upstream, keep, stream=call.request.stream, max_bytes=self.store.max_bytes)


class Stored:
    """A stored answer as an engine's (blazar/adapters/engines/client.py Upstream): its bytes as they were sent, the
    model named as the client named it."""

    def __init__(self, entry: Entry, rename: Rename | None) -> None:
        self._entry, self._rename, self._closed = entry, rename, False

    @property
    def status_code(self) -> int:
        return self._entry.status

    @property
    def headers(self) -> Mapping[str, str]:
        return {"content-type": self._entry.content_type}

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def aiter_raw(self, heartbeat_s: float | None = None) -> AsyncIterator[bytes]:
        for block in self._entry.blocks:
            out = self._rename(block) if self._rename is not None else block
            if out:
                yield out
        if self._rename is not None and self._rename.carry:
            yield self._rename.rest()

    async def aread(self) -> bytes:
        body = b"".join(self._entry.blocks)
        return self._rename.whole(body) if self._rename is not None else body

    async def aclose(self) -> None:
        self._closed = True


class Tape:
    """An engine's answer relayed as it is, its bytes kept; `keep` gets them once the answer was whole (a stream to its
    `[DONE]` without an error event, a body read to its end), never when it broke, was cut or ran over `max_bytes`."""

    def __init__(self, inner: Upstream, keep: Callable[[tuple[bytes, ...]], None], *, stream: bool,
                 max_bytes: int) -> None:
        self._inner, self._keep, self._stream, self._max = inner, keep, stream, max_bytes
        self._blocks: list[bytes] | None = []
        self._size = 0
        self._whole = False

    @property
    def status_code(self) -> int:
        return self._inner.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self._inner.headers

    @property
    def is_closed(self) -> bool:
        return self._inner.is_closed

    def _taped(self, block: bytes) -> None:
        if self._blocks is None or not block:
            return
        self._size += len(block)
        if self._size > self._max:
            self._blocks = None  # too big to keep: relayed all the same
            return
        self._blocks.append(block)

    async def aiter_raw(self, heartbeat_s: float | None = None) -> AsyncIterator[bytes]:
        async for block in self._inner.aiter_raw(heartbeat_s):
            self._taped(block)
            yield block
        self._whole = True

    async def aread(self) -> bytes:
        data = await self._inner.aread()
        self._taped(data)
        self._whole = True
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()
        blocks, self._blocks = self._blocks, None
        if not blocks:
            return
        if self._stream:  # whole once its [DONE] came (the client may hang up right after it)
            tail = b"".join(blocks[-4:])[-8192:]
            if b"data: [DONE]" not in tail or (b'"error"' in tail and stream_error(tail) is not None):
                return
        elif not self._whole:
            return
        self._keep(tuple(blocks))
