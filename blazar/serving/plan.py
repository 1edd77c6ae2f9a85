"""One API request as the pipeline sees it (`Plan`: what the dialect asks of the engine, how the answer goes back,
and its way through the pipeline) and what comes out (`Answer`: a stream or a body for the route to send).

A route parses its dialect into a Plan; `Gateway.serve(plan)` resolves, loads, admits, asks the engine and records;
the route renders the Answer. The model is resolved once (`plan.resolved`), and that record travels to the argv.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from blazar.cluster.nodes import Peer
from blazar.dialects.stream import Translator
from blazar.dialects.tools import Forced
from blazar.events.requests import HOP_ACTOR
from blazar.instances.supervisor import Instance, ResolvedModel
from blazar.sentinels import UNSET
from blazar.serving.admission import Ticket
from blazar.serving.limits import Lease
from blazar.serving.principal import Principal


@dataclass
class Plan:
    """What a dialect asks of the engine for one request, how the answer goes back, and how far it got."""

    # -- asked: the dialect's translation of the client's body
    model: str  # as the client named it: every answer carries this name, never the engine's file
    engine_path: str  # the engine route: /v1/chat/completions, /v1/completions, /v1/embeddings, ...
    body: dict[str, Any] | None  # the engine's body; None sends the client's bytes (`raw`) as they came
    stream: bool
    max_tokens: int | None = None
    ctx: int | None = None  # the context per slot the caller asked for (Ollama's num_ctx): any covering instance
    keep_alive: Any = UNSET  # the caller's keep_alive for the model (Ollama's), else the instance's own
    embeddings: bool = False
    stream_as: Callable[[Plan], Translator] | None = None  # None relays the engine's SSE untouched
    reply: Callable[[dict[str, Any], Plan], Any] | None = None  # None answers the engine's bytes untouched
    forced: Forced | None = None
    # A request the dialect answers without the engine (Ollama's load-only request, nothing to embed): the answer.
    instead: Callable[[], Awaitable[dict[str, Any]]] | None = None

    # -- the request around it (the route sets these)
    trace_id: str = ""
    dialect: str = "openai"
    route: str = ""  # the client's route: /v1/chat/completions, /v1/messages, /api/chat, ...
    raw: bytes = b""  # the client's body as it came
    parsed: dict[str, Any] = field(default_factory=dict)  # ... and as the route parsed it
    priority: int = 0
    client: str | None = None  # the peer's address
    client_trace_id: str | None = None  # the client's x-blazar-trace-id when it is not the trace id (already used)
    parent_trace_id: str | None = None  # the client's W3C traceparent: its trace ...
    parent_span_id: str | None = None  # ... and the span this request is a child of
    principal: Principal | None = None  # who is calling (blazar/api/auth.py); None while auth is off
    tenant: str | None = None  # whose prompts, sessions and cache this is (blazar/serving/tenancy.py)
    # What the client asked of Blazar itself (blazar/api/request_options.py)
    session: str | None = None  # in its tenant's namespace: its turns go to the slot holding its prefix
    deadline_ms: int | None = None  # from `received`: EDF in the queue, refused at once when it cannot be met
    best_of: int | None = None
    cascade: tuple[str, ...] = ()

    # -- its way through the pipeline (the gateway sets these)
    received: float = field(default_factory=time.perf_counter)
    resolved: ResolvedModel | None = None  # the store's model, once resolved
    remote: str | None = None  # the remote engine serving the model (not in the store), by its name
    forwarded_from: str | None = None  # the node that forwarded this request here (cluster key checked)
    peer: Peer | None = None  # the node this request is forwarded to, where the model is ready
    forward_observations: dict[str, Any] = field(default_factory=dict)  # what the forwarding decision weighed
    instance: Instance | None = None
    load_ms: float | None = None  # the cold load this request waited for, if any
    ticket: Ticket | None = None
    held: bool = False
    queue_position: int = 0
    first_token_at: float | None = None
    lease: Lease | None = None  # the key's concurrency lease, held until the answer ends
    done: bool = False
    dirty: bool = False  # the engine body was changed after the payload was first encoded (settings, id_slot)
    detached: bool = False  # a shared generation now runs on its own: the caller's task ending does not end it
    provisional: bool = False  # a cascade step that is not the last: a refusal ends the step, not the request
    rerouted: bool = False  # routed again once already: its first instance was gone before it took the request
    shared_role: str | None = None  # single-flight: "leader" once followed, "promoted" once handed on
    usage: dict[str, Any] | None = None  # how it ended: the usage read from the engine, the status, failed or not
    end_status: int | None = None
    failed: bool = False

    @property
    def name(self) -> str | None:
        """The store's name, once resolved."""
        return self.resolved.name if self.resolved is not None else None

    @property
    def actor(self) -> str | None:
        """Who the request's events are recorded as: the caller's key where keys are on; for a hop forwarded by
        another node, "node:<it>" (the projections count a request once, where it came in)."""
        if self.forwarded_from is not None:
            return f"{HOP_ACTOR}{self.forwarded_from}"
        return self.principal.actor if self.principal is not None else None

    def deadline_left_s(self) -> float | None:
        """Seconds left until the deadline (negative once passed); None without one."""
        if self.deadline_ms is None:
            return None
        return self.deadline_ms / 1000.0 - (time.perf_counter() - self.received)

    def set_engine_field(self, name: str, value: Any) -> None:
        """Set one field of the engine's body (the client's bytes, when they were to go as they came, are parsed
        into a body first)."""
        if self.body is None:
            self.body = dict(self.parsed)
        self.body[name] = value
        self.dirty = True

    def payload(self) -> bytes:
        """The bytes the engine is sent."""
        return self.raw if self.body is None else orjson.dumps(self.body)

    def engine_body(self) -> dict[str, Any]:
        """The engine's body as an object (for counting tokens): the translated one, or the client's."""
        return self.body if self.body is not None else self.parsed


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
