"""One API request as the client asked it (`Request`: immutable) and what the pipeline gives back (`Answer`).

A route's dialect parses the client's body into a Request (what the engine is asked, how the answer goes back); the
route adds the request around it (trace id, caller, tenant, Blazar's own options) with `dataclasses.replace`, and
hands it to `Gateway.serve`, which opens a `Call` (blazar/serving/call.py) for its way through the pipeline. Only
the work on its content, which the gateway runs once the caller's checks allow it (its images and audio checked, a
route's own `prepare`), makes a new Request for the Call; what a request's way changes otherwise (a model's settings,
a cascade's step, the slot named to the engine) is the Call's.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blazar.dialects.stream import Translator
from blazar.dialects.tools import Forced
from blazar.events.audio import AudioRoute
from blazar.events.requests import HOP_ACTOR, Dialect, MediaFacts
from blazar.sentinels import UNSET
from blazar.serving.principal import Principal

if TYPE_CHECKING:
    from blazar.serving.call import Call


@dataclass(frozen=True, slots=True)
class AudioAsked:
    """What a speech request asked, for its `request.audio` event: the route (an engine kind's: transcriptions,
    translations, speech), the answer's format, and the input's size (never its content)."""

    route: AudioRoute
    response_format: str
    audio_seconds: float | None = None  # an upload's duration, probed before it is sent
    input_bytes: int | None = None
    input_chars: int | None = None
    language: str | None = None
    voice: str | None = None


@dataclass(frozen=True, slots=True)
class Hooks:
    """What a route does around the engine, beyond relaying it (each None: relayed as it is)."""

    stream_as: Callable[[Call], Translator] | None = None  # the engine's SSE translated for the client
    reply: Callable[[dict[str, Any], Call], Any] | None = None  # the engine's whole answer, in the client's shape
    # A request the dialect answers without the engine (Ollama's load-only request, nothing to embed): the answer.
    instead: Callable[[], Awaitable[dict[str, Any]]] | None = None
    # The answer made by the route's own exchange with the admitted instance (text to speech: sentence by sentence),
    # instead of one request relayed; it ends the call when its answer ends.
    produce: Callable[[Call], Awaitable[Answer]] | None = None
    # The route's own work on the body's content (an upload's audio decoded and measured, framed for the child): run
    # by the gateway only once the key's scope, the model's kind and the key's limits allow the request; it returns
    # the Request as the engine gets it (a 400 raised there is recorded as the request's refusal).
    prepare: Callable[[Request], Awaitable[Request]] | None = None
    # The request waits for a slot (its `request.queued`): its position (1 = next) and the queue's depth, for a
    # caller that tells its client (a realtime session's blazar.response.queued). Called on the loop; never blocks.
    on_queued: Callable[[int, int], None] | None = None


NO_HOOKS = Hooks()


@dataclass(frozen=True, slots=True)
class Request:
    """What a client asked, as its dialect parsed it, and the request around it."""

    # -- asked: the dialect's translation of the client's body
    model: str  # as the client named it: every answer carries this name, never the engine's file
    engine_path: str  # the engine route: /v1/chat/completions, /v1/completions, /v1/embeddings, ...
    body: dict[str, Any] | None  # the engine's body; None sends the client's bytes (`raw`) as they came
    stream: bool
    max_tokens: int | None = None
    ctx: int | None = None  # the context per slot the caller asked for (Ollama's num_ctx): any covering instance
    keep_alive: Any = UNSET  # the caller's keep_alive for the model (Ollama's), else the instance's own
    embeddings: bool = False
    rerank: bool = False  # served by an instance in rerank mode (llama-server --reranking), and only by one
    hooks: Hooks = NO_HOOKS  # what the route does around the engine
    forced: Forced | None = None
    # -- a speech request (blazar/api/audio.py): served by an engine kind other than llama-server
    audio: AudioAsked | None = None
    content_type: str | None = None  # the engine body's media type when it is not JSON (a multipart upload)

    # -- the request around it (the route sets these)
    trace_id: str = ""
    dialect: Dialect = "openai"
    path: str = ""  # the client's HTTP route: /v1/chat/completions, /v1/messages, /api/chat, ...
    raw: bytes = b""  # the client's body as it came
    parsed: dict[str, Any] = field(default_factory=dict)  # ... and as the route parsed it
    priority: int = 0
    client: str | None = None  # the peer's address
    agent: str | None = None  # the client's program: its User-Agent's first product (blazar/serving/prefix.py)
    client_trace_id: str | None = None  # the client's x-blazar-trace-id when it is not the trace id (already used)
    parent_trace_id: str | None = None  # the client's W3C traceparent: its trace ...
    parent_span_id: str | None = None  # ... and the span this request is a child of
    principal: Principal | None = None  # who is calling (blazar/api/auth.py); None while auth is off
    tenant: str | None = None  # whose prompts, sessions and cache this is (blazar/serving/tenancy.py)
    forwarded_from: str | None = None  # the node that forwarded this request here (cluster key checked)
    # What the client asked of Blazar itself (blazar/api/request_options.py)
    session: str | None = None  # in its tenant's namespace: its turns go to the slot holding its prefix
    deadline_ms: int | None = None  # from `received`: EDF in the queue, refused at once when it cannot be met
    best_of: int | None = None
    cascade: tuple[str, ...] = ()
    spec: str | None = None  # speculation asked: "off" (never drafts), "auto" or None (the governor decides)
    cache: str | None = None  # X-Blazar-Cache: "use", "refresh", "off"; None: the settings decide
    received: float = field(default_factory=time.perf_counter)
    media: MediaFacts | None = None  # its images' and audio's facts, once checked (blazar/serving/media.py)

    @property
    def actor(self) -> str | None:
        """Who the request's events are recorded as: the caller's key where keys are on; for a hop forwarded by
        another node, "node:<it>" (the projections count a request once, where it came in)."""
        if self.forwarded_from is not None:
            return f"{HOP_ACTOR}{self.forwarded_from}"
        return self.principal.actor if self.principal is not None else None

    @property
    def key_name(self) -> str | None:
        """The caller's key, whose limits count this request's tokens; None while keys are off."""
        return self.principal.key_name if self.principal is not None else None


@dataclass
class Answer:
    """What the gateway gives the route to send: a stream, the engine's bytes, a translated body, or the engine's
    refusal (its status and body, for the route to put in the caller's shape)."""

    status: int
    content_type: str | None = None
    stream: AsyncIterator[bytes] | None = None
    data: bytes | None = None
    media: Any = None
    refused: bytes | None = None  # the engine's error body (status >= 400), as it sent it
    refusal: tuple[str, str] | None = None  # ... and its message and type, read once
    headers: dict[str, str] = field(default_factory=dict)
