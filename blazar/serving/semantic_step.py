"""The semantic cache on a request's way (blazar/serving/cache_step.py asks it after an exact miss): the request's
prompt embedded by the embedding model (`routing.semantic_cache_model`), through Blazar's own pipeline as an internal
/v1/embeddings request of the same caller (recorded, routed and admitted like any: the memory plan holds), and the
nearest stored prompt of the same context (blazar/serving/semantic_cache.py) found. The embedding model failing is a
miss, never the request's failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from blazar.events.requests import RequestCacheMissed
from blazar.ids import new_trace_id
from blazar.serving.call import Call
from blazar.serving.request import Answer, Request
from blazar.serving.response_cache import Identity
from blazar.serving.semantic_cache import Match, Vector, VectorIndex, context_key, prompt_text, unit

if TYPE_CHECKING:
    from blazar.context import Blazar

log = logging.getLogger(__name__)

EMBED_PATH = "/v1/embeddings"
EMBED_TIMEOUT_S = 120.0  # a cold embedding model loads first; past this the request is a miss and runs
Serve = Callable[[Request], Awaitable[Answer]]


@dataclass(frozen=True, slots=True)
class Probe:
    """A request's semantic lookup: its context key, its prompt's vector (None: not embedded, and why), and what it
    found."""

    context: str
    vector: np.ndarray | None
    threshold: float
    match: Match | None = None
    best: float | None = None
    failed: str | None = None  # why there is no vector: the embedding model's refusal or error, in short
    embed_trace_id: str | None = None  # the internal embeddings request's trace

    def missed(self, trace_id: str, model: str) -> RequestCacheMissed:
        """The miss as an event (its why, never the prompt)."""
        return RequestCacheMissed(trace_id=trace_id, model=model, source="semantic", threshold=self.threshold,
                                  best_similarity=round(self.best, 4) if self.best is not None else None,
                                  unavailable=self.failed, embed_trace_id=self.embed_trace_id)

    def said(self) -> str:
        """What the miss's x-blazar-cache header adds: the best similarity seen, or why there was none."""
        if self.failed is not None:
            return f"semantic=unavailable ({self.failed})"
        return f"semantic={self.best:.3f}" if self.best is not None else "semantic=none"


class SemanticCache:
    def __init__(self, app: Blazar) -> None:
        self.app = app
        self.index = VectorIndex(self._settings()[2])

    def _settings(self) -> tuple[str, float, int]:
        r = self.app.settings().routing
        return r.semantic_cache_model, r.semantic_cache_threshold, r.semantic_cache_entries

    def enabled(self) -> bool:
        model, _, entries = self._settings()
        return bool(model) and entries > 0

    async def probe(self, call: Call, identity: Identity, serve: Serve, present: Callable[[str], bool]) -> Probe | None:
        """`call`'s lookup: None when it has no prompt to embed or no context key; else its vector (or why not) and
        the nearest stored prompt at or above the threshold whose answer is still kept."""
        model, threshold, entries = self._settings()
        self.index.embedded_by(model)
        if self.index.max_entries != entries:
            self.index.bound(entries)
        r, body = call.request, call.ask.engine_body()
        text = prompt_text(body)
        context = context_key(r.tenant, identity, r.engine_path, body, stream=r.stream)
        if text is None or context is None:
            return None
        trace_id = new_trace_id()
        vector, failed = await self._embed(call, model, text, serve, trace_id)
        if vector is None:
            return Probe(context, None, threshold, failed=failed, embed_trace_id=trace_id)
        match, best = self.index.nearest(context, vector, threshold, present)
        return Probe(context, vector, threshold, match, best, embed_trace_id=trace_id)

    def keep(self, probe: Probe, entry: str, model: str) -> None:
        """The answer kept under `entry` is found by its prompt's vector from now on."""
        if probe.vector is not None:
            self.index.put(Vector(probe.context, entry, model, probe.vector))

    async def _embed(self, call: Call, model: str, text: str, serve: Serve,
                     trace_id: str) -> tuple[np.ndarray | None, str | None]:
        """The prompt's unit vector from the embedding model, as the caller's internal request; (None, why) when it
        could not be had."""
        r = call.request
        body = {"model": model, "input": text}
        asked = Request(model=model, engine_path=EMBED_PATH, body=None, stream=False, embeddings=True)
        request = replace(asked, trace_id=trace_id, dialect="openai", path=EMBED_PATH, raw=orjson.dumps(body),
                          parsed=body, priority=r.priority, client=r.client, agent=r.agent,
                          parent_trace_id=r.parent_trace_id, principal=r.principal, tenant=r.tenant)
        try:
            answer = await asyncio.wait_for(serve(request), EMBED_TIMEOUT_S)
        except TimeoutError:
            return None, f"no embedding within {EMBED_TIMEOUT_S:.0f} s"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a refusal (Refused), the model gone, a bad answer: a miss, never the request's end
            log.info("semantic cache: embedding %s failed: %s", request.trace_id, e)
            return None, type(e).__name__
        return _vector_of(answer)


def _vector_of(answer: Answer) -> tuple[np.ndarray | None, str | None]:
    if answer.status != 200 or answer.data is None:
        return None, f"embedding answer {answer.status}"
    try:
        data: Any = orjson.loads(answer.data)
        vector = unit(data["data"][0]["embedding"])
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
        return None, "embedding answer unreadable"
    return (vector, None) if vector is not None else (None, "embedding empty")
