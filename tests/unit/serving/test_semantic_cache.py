"""The semantic response cache: its matching rule (blazar/serving/semantic_cache.py: what is embedded, what else must
be equal, the threshold, the LRU bound) and its step (blazar/serving/semantic_step.py via cache_step.py) with a fake
embedder behind the pipeline's `serve`: a similar prompt of the same tenant and context is a `semantic` hit, another
tenant's or another context's never, and the embedding model failing is a miss that still runs the request."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import orjson
import pytest

from blazar.errors import Refused
from blazar.events.base import Event
from blazar.events.model_settings import ModelSettings
from blazar.serving.cache_step import ResponseCache
from blazar.serving.call import Call
from blazar.serving.request import Answer, Request
from blazar.serving.response_cache import Identity, cache_use
from blazar.serving.route import Route
from blazar.serving.semantic_cache import Vector, VectorIndex, context_key, prompt_text, semantic_on, unit
from tests.support.resolved import resolved
from tests.unit.serving.test_cache_step import WHOLE, Desk, Pipeline

ID = Identity(model_sha256="a" * 64, engine="b8000@3", posture="", template="jinja:0123")


def chat(text: str, **more: Any) -> dict[str, Any]:
    return {"model": "gemma", "messages": [{"role": "user", "content": text}], "temperature": 0, **more}


# -- the rule -------------------------------------------------------------------------------------------------------

def test_what_is_embedded_is_the_prompt_as_the_engine_gets_it() -> None:
    body = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]}]}
    assert prompt_text(body) == "system: Be brief.\nuser: Hi"
    assert prompt_text({"prompt": "Once upon"}) == "Once upon"
    assert prompt_text({"prompt": "  "}) is None and prompt_text({"input": "x"}) is None


def test_the_context_key_is_the_exact_key_less_the_prompt() -> None:
    a = context_key("key:a", ID, "/v1/chat/completions", chat("What is the sea?"), stream=False)
    assert a is not None and len(a) == 64
    assert a == context_key("key:a", ID, "/v1/chat/completions", chat("What's the sea?"), stream=False)
    others = [context_key("key:b", ID, "/v1/chat/completions", chat("What is the sea?"), stream=False),
              context_key("key:a", replace(ID, model_sha256="b" * 64), "/v1/chat/completions", chat("x"),
                          stream=False),
              context_key("key:a", replace(ID, template="jinja:ffff"), "/v1/chat/completions", chat("x"), stream=False),
              context_key("key:a", ID, "/v1/chat/completions", chat("x", max_tokens=9), stream=False),
              context_key("key:a", ID, "/v1/chat/completions", chat("x"), stream=True),
              context_key("key:a", ID, "/v1/chat/completions",
                          {**chat("x"), "messages": [{"role": "system", "content": "x"}]}, stream=False)]
    assert a not in others and len(set(others)) == len(others)


@pytest.mark.parametrize(("key", "model", "on"), [
    (None, "semantic", True), ("semantic", None, True), ("exact", "semantic", False), ("off", "semantic", False),
    (None, "exact", False), (None, None, False)])
def test_the_keys_setting_then_the_models_turn_it_on(key: str | None, model: str | None, on: bool) -> None:
    assert semantic_on(key, model) is on
    assert cache_use(None, key, model) == ("use" if (key or model) in ("exact", "semantic") and key != "off" else None)


def v(*xs: float) -> np.ndarray:
    out = unit(list(xs))
    assert out is not None
    return out


def test_the_nearest_at_or_above_the_threshold_of_its_own_context_only() -> None:
    index = VectorIndex(8)
    index.put(Vector("ctx-a", "e1", "gemma", v(1, 0)))
    index.put(Vector("ctx-a", "e2", "gemma", v(0.6, 0.8)))
    index.put(Vector("ctx-b", "e3", "gemma", v(0, 1)))
    match, best = index.nearest("ctx-a", v(0, 1), 0.75)
    assert match is not None and match.entry == "e2" and match.similarity == pytest.approx(0.8) == best
    assert index.nearest("ctx-a", v(0, 1), 0.85) == (None, pytest.approx(0.8))  # below the threshold
    assert index.nearest("ctx-c", v(0, 1), 0.1) == (None, None)  # another context (a tenant's) is never compared
    assert index.nearest("ctx-a", v(1, 1), 0.5, present=lambda e: e != "e2")[0].entry == "e1"  # type: ignore[union-attr]
    assert unit([0.0, 0.0]) is None and unit([]) is None and unit([float("nan")]) is None


def test_the_index_is_bounded_least_recently_used_first_and_another_embedder_empties_it() -> None:
    index = VectorIndex(2)
    index.embedded_by("gemma")
    index.put(Vector("c", "e1", "gemma", v(1, 0)))
    index.put(Vector("c", "e2", "gemma", v(0, 1)))
    assert index.nearest("c", v(1, 0), 0.9)[0] is not None  # e1 used: e2 is now the oldest
    index.put(Vector("c", "e3", "other", v(1, 1)))
    assert len(index) == 2 and index.nearest("c", v(0, 1), 0.99)[0] is None
    assert index.drop_model("other") == 1 and len(index) == 1
    index.embedded_by("gemma")
    assert len(index) == 1
    index.embedded_by("nomic")
    assert len(index) == 0


# -- the step, with a fake embedder ----------------------------------------------------------------------------------

VECTORS = {"What is the sea?": [1.0, 0.0, 0.1], "What's the sea?": [0.98, 0.05, 0.1], "Bake bread.": [0.0, 1.0, 0.0]}


class Embedding(Pipeline):
    """The fake pipeline, whose `serve` answers the internal embeddings request from VECTORS (or fails as told)."""

    def __init__(self, cache: ResponseCache, fail: BaseException | None = None) -> None:
        super().__init__(cache)
        self.fail, self.embedded = fail, cast(list[Request], [])

    async def serve(self, request: Request, watcher: asyncio.Task[None] | None = None) -> Answer:
        self.embedded.append(request)
        if self.fail is not None:
            raise self.fail
        text = orjson.loads(request.raw)["input"].removeprefix("user: ")
        return Answer(status=200, data=orjson.dumps({"data": [{"embedding": VECTORS[text]}]}))


def app(model: str = "embedder") -> Any:
    routing = SimpleNamespace(response_cache_mib=1, semantic_cache_model=model, semantic_cache_threshold=0.95,
                              semantic_cache_entries=16)
    return SimpleNamespace(
        log=SimpleNamespace(subscribe=lambda listener: (lambda: None)),
        settings=lambda: SimpleNamespace(routing=routing),
        runner=SimpleNamespace(state=lambda name: SimpleNamespace(active=None, engines={}, models={})),
        clock=SimpleNamespace(now=lambda: 1000.0))


def call(trace: str, text: str, *, tenant: str = "key:a", setting: str = "semantic", **more: Any) -> Call:
    request = Request(model="gemma", engine_path="/v1/chat/completions", body=chat(text, **more), stream=False,
                      trace_id=trace, tenant=tenant, path="/v1/chat/completions")
    c = Call(request, Desk())
    c.take_route(Route("gemma", replace(resolved("gemma"), sha256="aa" * 32,
                                        settings=ModelSettings(cache=cast(Any, setting)))))
    return c


def serve(cache: ResponseCache, pipeline: Pipeline, c: Call) -> Answer:
    return asyncio.run(cache.serve(c, None, pipeline))


def hits(c: Call, kind: str = "request.cache_hit") -> list[Any]:
    return [e for e in cast(Desk, c._desk).events if isinstance(e, Event) and kind == e.TYPE]


def test_a_similar_prompt_is_a_semantic_hit_and_a_dissimilar_or_another_tenants_a_miss() -> None:
    cache = ResponseCache(cast(Any, app()))
    pipeline = Embedding(cache)
    first = serve(cache, pipeline, call("t1", "What is the sea?"))
    assert first.headers["x-blazar-cache"] == "miss; semantic=none" and len(cache.semantic.index) == 1
    inner = pipeline.embedded[0]
    assert inner.model == "embedder" and inner.embeddings and inner.tenant == "key:a" and inner.trace_id != "t1"
    similar = call("t2", "What's the sea?")
    answer = serve(cache, pipeline, similar)
    assert pipeline.ran == 1 and answer.data == WHOLE
    assert answer.headers["x-blazar-cache"].startswith("hit-semantic; similarity=0.99")
    [hit] = hits(similar)
    assert hit.source == "semantic" and 0.95 <= hit.similarity < 1 and hit.entry in cache.store
    dissimilar = call("t3", "Bake bread.")
    assert serve(cache, pipeline, dissimilar).headers["x-blazar-cache"].startswith("miss; semantic=0.")
    [missed] = hits(dissimilar, "request.cache_missed")
    assert missed.source == "semantic" and missed.best_similarity < missed.threshold == 0.95
    assert missed.unavailable is None and missed.embed_trace_id == pipeline.embedded[-1].trace_id
    theirs = call("t4", "What's the sea?", tenant="key:b")
    assert serve(cache, pipeline, theirs).headers["x-blazar-cache"] == "miss; semantic=none" and not hits(theirs)
    assert hits(theirs, "request.cache_missed")[0].best_similarity is None
    other_params = call("t5", "What's the sea?", max_tokens=3)
    assert serve(cache, pipeline, other_params).headers["x-blazar-cache"] == "miss; semantic=none"
    assert pipeline.ran == 4


def test_the_exact_entry_answers_first_without_embedding() -> None:
    cache = ResponseCache(cast(Any, app()))
    pipeline = Embedding(cache)
    serve(cache, pipeline, call("t1", "What is the sea?"))
    again = call("t2", "What is the sea?")
    assert serve(cache, pipeline, again).headers["x-blazar-cache"].startswith("hit; age=")
    assert len(pipeline.embedded) == 1 and hits(again)[0].source == "exact"


@pytest.mark.parametrize("setting", ["exact", "semantic"])
def test_no_embedding_model_or_an_exact_setting_never_embeds(setting: str) -> None:
    cache = ResponseCache(cast(Any, app(model="" if setting == "semantic" else "embedder")))
    pipeline = Embedding(cache)
    assert serve(cache, pipeline, call("t1", "What is the sea?", setting=setting)).headers["x-blazar-cache"] == "miss"
    assert not pipeline.embedded and len(cache.semantic.index) == 0


@pytest.mark.parametrize("fail", [Refused("no such model", reason="model_not_found"), RuntimeError("engine died")])
def test_the_embedding_model_failing_is_a_miss_and_the_request_runs(fail: BaseException) -> None:
    cache = ResponseCache(cast(Any, app()))
    pipeline = Embedding(cache, fail)
    c = call("t1", "What is the sea?")
    answer = serve(cache, pipeline, c)
    assert answer.status == 200 and answer.data == WHOLE and pipeline.ran == 1
    assert answer.headers["x-blazar-cache"] == f"miss; semantic=unavailable ({type(fail).__name__})"
    [missed] = hits(c, "request.cache_missed")
    assert missed.unavailable == type(fail).__name__ and missed.best_similarity is None
    assert len(cache.store) == 1 and len(cache.semantic.index) == 0  # the exact entry kept all the same


def test_an_unreadable_embedding_is_a_miss() -> None:
    cache = ResponseCache(cast(Any, app()))
    pipeline = Embedding(cache)

    async def bad(request: Request, watcher: Any = None) -> Answer:
        return Answer(status=200, data=b'{"data": []}')

    pipeline.serve = bad  # type: ignore[method-assign]
    said = serve(cache, pipeline, call("t1", "What is the sea?")).headers["x-blazar-cache"]
    assert said == "miss; semantic=unavailable (embedding answer unreadable)"


# -- the settings that turn it on -------------------------------------------------------------------------------------

def test_a_model_and_a_key_may_be_set_to_semantic_and_nothing_else_new() -> None:
    from blazar.errors import InvalidModelSettings
    from blazar.operations.keys import KeyCommandError, check_cache
    from blazar.store.model_settings import SettingsChange

    settings, changed = SettingsChange(cache="semantic").applied_to(None)
    assert settings.cache == "semantic" and changed == ["cache"]
    assert SettingsChange(cache="none").applied_to(settings)[0].cache is None
    with pytest.raises(InvalidModelSettings, match="exact, semantic, off or none"):
        SettingsChange(cache="fuzzy").applied_to(None)
    assert check_cache("semantic") == "semantic" and check_cache("none") is None
    with pytest.raises(KeyCommandError):
        check_cache("fuzzy")
