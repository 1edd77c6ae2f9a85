"""Request events: the life of one API request, every decision on its way with what it was based on. They go through
the group-commit writer (CONTROL = False): never on the token path, and a crash may lose the last batch of them.

All of one request share the envelope's trace id and the stream `trace:<id>`; `blazar why TRACE` replays them.
Content (prompts, completions) is never recorded: only sizes, counts and timings.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from blazar.events.base import Event
from blazar.events.registry import register, upcaster

Dialect = Literal["openai", "ollama", "anthropic"]


class _RequestEvent(Event):
    CONTROL = False
    AUDIT = False

    trace_id: str

    def stream_key(self) -> str:
        return f"trace:{self.trace_id}"


@register
class RequestReceived(_RequestEvent):
    TYPE = "request.received"

    dialect: Dialect
    route: str  # "/v1/chat/completions"
    model: str  # as the client named it
    stream: bool = False
    body_bytes: int = 0
    priority: int = 0  # higher is served first (X-Blazar-Priority)
    max_tokens: int | None = None
    client: str | None = None  # the peer address
    # The x-blazar-trace-id the client sent, when it is not the trace id: already used, or a traceparent's won.
    client_trace_id: str | None = None
    # The client's W3C traceparent, when it sent a valid one: the trace it belongs to and the span that is this
    # request's parent (an OpenTelemetry export makes the request's span its child).
    parent_trace_id: str | None = None
    parent_span_id: str | None = None


@register
class RequestQueued(_RequestEvent):
    """A decision: no free slot; the request waits at `position` (1 = next) behind `depth - 1` others."""

    TYPE = "request.queued"

    model: str
    instance_id: str | None = None
    position: int
    depth: int
    slots: int
    busy: int


@register
class RequestAdmitted(_RequestEvent):
    """A decision: a slot is the request's; `waited_ms` in the queue (0 when it was free at once)."""

    TYPE = "request.admitted"

    model: str
    instance_id: str | None = None
    waited_ms: float = 0.0
    slots: int
    busy: int  # after admitting this one
    queued_behind: int = 0  # how many were ahead of it when it queued


@register
class RequestRejected(_RequestEvent):
    """A decision: the request was refused before any token, with the status, the reason and the numbers."""

    TYPE = "request.rejected"

    model: str | None = None
    status: int
    reason: Literal[
        "queue_full", "queue_timeout", "global_cap", "context_length_exceeded", "model_not_found",
        "invalid_request", "circuit_open", "insufficient_memory", "no_engine", "load_failed", "shutting_down",
        # What else a load can refuse with (blazar/errors.py's http_status): a pin in the way, an unusable engine.
        "model_pinned", "engine_incompatible", "engine_error", "invalid_model_file", "hub_error",
        # A key's refusals: a model outside its --models scope (403), one of its limits reached (429).
        "model_not_allowed", "rate_limit_exceeded",
    ]
    detail: str
    retry_after_s: float | None = None
    observations: dict[str, Any] = Field(default_factory=dict)
    duration_ms: float | None = None  # from the request's arrival to the refusal, at the server


class Evicted(BaseModel):
    """One instance evicted to make room for a request's load."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    instance_id: str
    reason: str  # the eviction's reason: memory, max_loaded_models, reshape, ...


@register
class RequestRouted(_RequestEvent):
    """Which instance serves the request, warm or cold, and what the supervisor did to get it.

    v2: `evicted` holds structured victims (v1 said "model (instance_id, reason)" in prose)."""

    TYPE = "request.routed"
    V = 2

    model: str
    instance_id: str
    port: int
    cold: bool  # True: this request waited for a load
    load_ms: int | None = None
    evicted: list[Evicted] = Field(default_factory=list)  # what made room
    ctx_tokens: int | None = None


_V1_VICTIM = re.compile(r"^(?P<model>.*?) \((?P<instance_id>[^,()]+), (?P<reason>[^()]*)\)$")


@upcaster(RequestRouted.TYPE, 1)
def _routed_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """v1 → v2: each "model (instance_id, reason)" becomes {model, instance_id, reason}. An entry that does not
    parse keeps its text as the model, with an unknown instance and reason, so nothing is lost."""
    victims = []
    for entry in payload.get("evicted") or []:
        m = _V1_VICTIM.match(str(entry))
        victims.append(m.groupdict() if m else {"model": str(entry), "instance_id": "", "reason": "unknown"})
    return {**payload, "evicted": victims}


@register
class RequestFirstToken(_RequestEvent):
    TYPE = "request.first_token"

    model: str
    ttft_ms: float  # from received to the first byte of generated output sent to the client


@register
class RequestCompleted(_RequestEvent):
    TYPE = "request.completed"

    model: str
    instance_id: str | None = None
    status: int = 200
    duration_ms: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # The engine's own timings (llama-server's `timings`: prompt_ms, predicted_ms, predicted_per_second, ...).
    engine_timings: dict[str, float] = Field(default_factory=dict)
    finish_reason: str | None = None
    chunks: int | None = None  # streamed chunks forwarded


@register
class RequestFailed(_RequestEvent):
    """The request had started (admitted, maybe streaming) and did not complete."""

    TYPE = "request.failed"

    model: str | None = None
    instance_id: str | None = None
    status: int
    reason: Literal["client_disconnected", "engine_error", "engine_crashed", "timeout", "internal_error"]
    detail: str = ""
    duration_ms: float = 0.0
