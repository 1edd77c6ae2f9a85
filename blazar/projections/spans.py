"""Request spans: committed request events folded into finished OpenTelemetry-shaped spans, one per request with
children for queue wait, model load, prefill and decode. Pure: no SDK, no clock, no I/O; times come from the events'
envelopes. The daemon feeds it what the group commit wrote and blazar/adapters/otel/ exports what it hands back, so a
span says what `blazar why` says. Not a registered projection: its state is only the requests still in flight.

Attributes follow the OpenTelemetry GenAI semantic conventions (gen_ai.*) plus blazar.* for the decisions. No prompt
or completion text exists in the events, so none can reach a span.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from blazar.events.audio import RequestAudio
from blazar.events.base import Recorded
from blazar.events.requests import (
    MediaFacts,
    RequestAdmitted,
    RequestCompleted,
    RequestEvent,
    RequestFailed,
    RequestFirstToken,
    RequestMediaChecked,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRouted,
)

AttrValue = str | bool | int | float | list[str]
Attributes = dict[str, AttrValue]

# Requests waiting for their terminal event; past this the oldest is given up (a crash lost its end) and counted.
MAX_IN_FLIGHT = 100_000
# What serves the tokens, as gen_ai.provider.name (and the older gen_ai.system) names it.
PROVIDER = "llama.cpp"

_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
_OPERATIONS = {
    "/v1/chat/completions": "chat", "/v1/messages": "chat", "/api/chat": "chat", "/v1/responses": "chat",
    "/v1/completions": "text_completion", "/api/generate": "text_completion",
    "/v1/embeddings": "embeddings", "/api/embed": "embeddings", "/api/embeddings": "embeddings",
    "/v1/rerank": "rerank", "/rerank": "rerank",
    "/v1/audio/transcriptions": "transcription", "/v1/audio/translations": "translation", "/v1/audio/speech": "speech",
}
# What runs a speech request's engine kind, as gen_ai.provider.name names it.
_AUDIO_PROVIDERS = {"whisper": "faster-whisper", "piper": "piper"}
_TERMINAL = (RequestCompleted, RequestFailed, RequestRejected)
_KINDS = frozenset({RequestReceived, RequestQueued, RequestAdmitted, RequestRouted, RequestFirstToken, RequestAudio,
                    RequestMediaChecked, *_TERMINAL})


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: Attributes = field(default_factory=dict)


@dataclass(slots=True)
class Span:
    """A finished span: ids in lowercase hex, times in ns since the epoch, `error` the status description when it
    failed (None: ok). Never changed once built (NOTE: not frozen: frozen construction was a third of the fold)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    kind: Literal["server", "internal"]
    attributes: Attributes
    error: str | None = None
    events: tuple[SpanEvent, ...] = ()


def otel_trace_id(trace_id: str, parent_trace_id: str | None = None) -> str:
    """The span's trace id: the client's traceparent's when it sent one, else the request's own when it is 32 hex,
    else one derived from it (sha256: stable, so every export of that request lands in one trace)."""
    if parent_trace_id:
        return parent_trace_id
    if _HEX32.fullmatch(trace_id) and set(trace_id) != {"0"}:
        return trace_id.lower()
    return hashlib.sha256(trace_id.encode()).hexdigest()[:32]


PARTS = ("request", "load", "queue", "prefill", "decode")


def span_ids(trace_id: str) -> dict[str, str]:
    """The span id of each part of a request, derived from its trace id (one sha512, eight 16-hex slices): stable
    across replays and re-exports."""
    digest = hashlib.sha512(trace_id.encode()).hexdigest()
    return {part: digest[16 * i:16 * (i + 1)] for i, part in enumerate(PARTS)}


def operation(route: str) -> str:
    return _OPERATIONS.get(route, "chat")


def _ns(ts: float) -> int:
    return round(ts * 1e9)


@dataclass(slots=True)
class _Request:
    received: Recorded
    routed: RequestRouted | None = None
    routed_ts: float = 0.0
    queued: RequestQueued | None = None
    queued_ts: float = 0.0
    admitted: RequestAdmitted | None = None
    admitted_ts: float = 0.0
    first_token_ts: float | None = None
    ttft_ms: float | None = None
    audio: RequestAudio | None = None
    media: MediaFacts | None = None  # request.media_checked's (older logs: request.received's)


class SpanFold:
    """Feed it committed events in seq order; it returns the spans of the requests that ended. Its state is the
    requests in flight (bounded: `max_in_flight`), so it starts empty and never replays the log."""

    def __init__(self, *, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.max_in_flight = max_in_flight
        self._open: dict[str, _Request] = {}
        self.abandoned = 0  # requests given up before their end (over max_in_flight)
        self.unmatched = 0  # terminal events of requests whose received this fold never saw

    @property
    def in_flight(self) -> int:
        return len(self._open)

    def feed(self, recorded: Iterable[Recorded]) -> list[tuple[Span, ...]]:
        """The spans of each request these events ended: its request span first, then its children."""
        out: list[tuple[Span, ...]] = []
        for rec in recorded:
            ev = rec.event
            if type(ev) not in _KINDS:  # most of a busy log is request events; the rest is skipped at once
                continue
            if isinstance(ev, RequestReceived):
                self._open[ev.trace_id] = _Request(rec)
                if len(self._open) > self.max_in_flight:
                    del self._open[next(iter(self._open))]
                    self.abandoned += 1
                continue
            assert isinstance(ev, RequestEvent)  # every type in _KINDS is
            trace_id = ev.trace_id
            req = self._open.get(trace_id)
            if req is None:
                self.unmatched += isinstance(ev, _TERMINAL)
                continue
            if isinstance(ev, RequestRouted):
                req.routed, req.routed_ts = ev, rec.ts
            elif isinstance(ev, RequestQueued):
                if req.queued is None:
                    req.queued, req.queued_ts = ev, rec.ts
            elif isinstance(ev, RequestAdmitted):
                req.admitted, req.admitted_ts = ev, rec.ts
            elif isinstance(ev, RequestFirstToken):
                req.first_token_ts, req.ttft_ms = rec.ts, ev.ttft_ms
            elif isinstance(ev, RequestAudio):
                req.audio = ev
            elif isinstance(ev, RequestMediaChecked):
                req.media = ev.media
            else:
                del self._open[trace_id]
                out.append(tuple(build_spans(req, rec)))
        return out


def build_spans(req: _Request, end: Recorded) -> list[Span]:
    """The request's span and its children, from what its events said; the children lie within the request."""
    rec = req.received
    received = rec.event
    terminal = end.event
    assert isinstance(received, RequestReceived) and isinstance(terminal, _TERMINAL)
    blazar_id = received.trace_id
    trace = otel_trace_id(blazar_id, received.parent_trace_id)
    ids = span_ids(blazar_id)
    root_id = ids["request"]
    t0, t1 = rec.ts, max(rec.ts, end.ts)

    def clamp(ts: float) -> float:
        return min(max(ts, t0), t1)

    def child(part: str, name: str, start: float, stop: float, attrs: Attributes, error: str | None = None,
              events: tuple[SpanEvent, ...] = ()) -> Span:
        start, stop = clamp(start), clamp(stop)
        return Span(name=name, trace_id=trace, span_id=ids[part], parent_span_id=root_id,
                    start_ns=_ns(start), end_ns=_ns(max(start, stop)), kind="internal", attributes=attrs,
                    error=error, events=events)

    op = operation(received.route)
    attrs = _request_attributes(req, end, op)
    error = _error_of(terminal)
    spans = [Span(name=f"{op} {received.model}", trace_id=trace, span_id=root_id,
                  parent_span_id=received.parent_span_id, start_ns=_ns(t0), end_ns=_ns(t1), kind="server",
                  attributes=attrs, error=error)]

    routed = req.routed
    if routed is not None and routed.cold and routed.load_ms is not None:
        evicted = tuple(SpanEvent("blazar.evicted", _ns(clamp(req.routed_ts - routed.load_ms / 1000)),
                                  {"blazar.model": v.model, "blazar.instance_id": v.instance_id,
                                   "blazar.reason": v.reason}) for v in routed.evicted)
        spans.append(child("load", "blazar.load", req.routed_ts - routed.load_ms / 1000, req.routed_ts, {
            "blazar.model": routed.model, "blazar.instance_id": routed.instance_id, "blazar.load_ms": routed.load_ms,
            "blazar.evicted.count": len(routed.evicted),
            "blazar.evicted.models": [v.model for v in routed.evicted],
            "blazar.evicted.instance_ids": [v.instance_id for v in routed.evicted],
            "blazar.evicted.reasons": [v.reason for v in routed.evicted],
        }, events=evicted))

    queued = req.queued
    if queued is not None:
        q_end = req.admitted_ts if req.admitted is not None else end.ts
        q_attrs: Attributes = {"blazar.queue.position": queued.position, "blazar.queue.depth": queued.depth,
                               "blazar.slots": queued.slots, "blazar.slots.busy": queued.busy}
        if req.admitted is not None:
            q_attrs["blazar.queue.waited_ms"] = req.admitted.waited_ms
        spans.append(child("queue", "blazar.queue", req.queued_ts, q_end, q_attrs,
                           error=None if req.admitted is not None else error))

    if req.admitted is not None:
        spans.extend(_engine_spans(req, end, op, error, child))
    return spans


def _engine_spans(req: _Request, end: Recorded, op: str, error: str | None, child: Callable[..., Span]) -> list[Span]:
    """Prefill (sent to the engine until the first token) and decode (first token to the end). A streamed answer
    times them by its first token; a whole one by the engine's own prompt_ms, when it says."""
    terminal = end.event
    received = req.received.event
    assert isinstance(received, RequestReceived)
    start = req.admitted_ts
    done = terminal if isinstance(terminal, RequestCompleted) else None
    timings = done.engine_timings if done is not None else {}
    prefill_attrs: Attributes = {}
    decode_attrs: Attributes = {}
    if done is not None:
        if done.prompt_tokens is not None:
            prefill_attrs["gen_ai.usage.input_tokens"] = done.prompt_tokens
        if done.cached_tokens is not None:
            prefill_attrs["gen_ai.usage.cache_read.input_tokens"] = done.cached_tokens
        if done.completion_tokens is not None:
            decode_attrs["gen_ai.usage.output_tokens"] = done.completion_tokens
        if done.chunks is not None:
            decode_attrs["blazar.chunks"] = done.chunks
    for name, key, target in (("prompt_ms", "blazar.engine.prompt_ms", prefill_attrs),
                              ("predicted_ms", "blazar.engine.predicted_ms", decode_attrs),
                              ("predicted_per_second", "blazar.engine.tokens_per_s", decode_attrs)):
        if isinstance(timings.get(name), int | float):
            target[key] = timings[name]
    if op in ("embeddings", "rerank"):
        return [child("prefill", "blazar.prefill", start, end.ts, prefill_attrs, error)]
    first = req.first_token_ts
    if not received.stream and isinstance(timings.get("prompt_ms"), int | float):
        first = start + float(timings["prompt_ms"]) / 1000
    if first is None:  # ended before any token: all of it was prefill
        return [child("prefill", "blazar.prefill", start, end.ts, prefill_attrs, error)]
    return [child("prefill", "blazar.prefill", start, first, prefill_attrs),
            child("decode", "blazar.decode", first, end.ts, decode_attrs, error)]


def _error_of(terminal: RequestCompleted | RequestFailed | RequestRejected) -> str | None:
    if isinstance(terminal, RequestRejected):
        return f"refused: {terminal.reason} (HTTP {terminal.status})"
    if isinstance(terminal, RequestFailed):
        return f"failed: {terminal.reason} (HTTP {terminal.status})"
    return f"engine answered HTTP {terminal.status}" if terminal.status >= 400 else None


def _request_attributes(req: _Request, end: Recorded, op: str) -> Attributes:
    rec = req.received
    received = rec.event
    terminal = end.event
    assert isinstance(received, RequestReceived) and isinstance(terminal, _TERMINAL)
    a: Attributes = {
        "gen_ai.operation.name": op, "gen_ai.provider.name": PROVIDER, "gen_ai.system": PROVIDER,
        "gen_ai.request.model": received.model,
        "http.request.method": "POST", "http.route": received.route, "http.response.status_code": terminal.status,
        "blazar.trace_id": received.trace_id, "blazar.dialect": received.dialect, "blazar.stream": received.stream,
        "blazar.priority": received.priority, "blazar.status": terminal.status,
        "blazar.outcome": {RequestCompleted: "completed", RequestFailed: "failed",
                           RequestRejected: "rejected"}[type(terminal)],
    }
    if received.max_tokens is not None:
        a["gen_ai.request.max_tokens"] = received.max_tokens
    if received.client_trace_id:
        a["blazar.client_trace_id"] = received.client_trace_id
    if rec.actor.startswith("key:"):
        a["blazar.key_name"] = rec.actor.removeprefix("key:")
    a.update(_media_attributes(req, received))
    routed = req.routed
    if routed is not None:
        a.update({"gen_ai.response.model": routed.model, "blazar.instance_id": routed.instance_id,
                  "blazar.cold": routed.cold})
        if routed.load_ms is not None and routed.cold:
            a["blazar.load_ms"] = routed.load_ms
        if routed.evicted:
            a["blazar.evicted.count"] = len(routed.evicted)
    if req.queued is not None:
        a["blazar.queue.position"] = req.queued.position
    if req.admitted is not None:
        a["blazar.admission.decision"] = "queued" if req.queued is not None else "admitted"
        a["blazar.queue.waited_ms"] = req.admitted.waited_ms
    elif isinstance(terminal, RequestRejected):
        a["blazar.admission.decision"] = "rejected"
    if req.ttft_ms is not None and received.stream:
        a["blazar.ttft_ms"] = req.ttft_ms
    a.update(_audio_attributes(req))
    a.update(_outcome_attributes(terminal))
    return a


def _media_attributes(req: _Request, received: RequestReceived) -> Attributes:
    """A chat's images and audio clips: their facts, never their bytes."""
    a: Attributes = {}
    media = req.media if req.media is not None else received.media
    if media is None:
        return a
    if media.images:
        a.update({"blazar.images.count": media.images, "blazar.images.bytes": media.image_bytes,
                  "blazar.images.types": ",".join(sorted(set(media.image_types)))})
    if media.audio_clips:
        a.update({"blazar.audio.count": media.audio_clips, "blazar.audio.bytes": media.audio_bytes})
    return a


def _audio_attributes(req: _Request) -> Attributes:
    """An audio route's request: the speech kind's provider, the audio's length, format and real-time factor."""
    a: Attributes = {}
    au = req.audio
    if au is None:
        return a
    provider = _AUDIO_PROVIDERS.get(au.kind, au.kind)
    a.update({"gen_ai.provider.name": provider, "gen_ai.system": provider, "blazar.engine_kind": au.kind,
              "blazar.audio.seconds": au.audio_seconds, "blazar.audio.format": au.response_format,
              "blazar.audio.processing_ms": au.processing_ms})
    if au.real_time_factor is not None:
        a["blazar.audio.real_time_factor"] = au.real_time_factor
    if au.language:
        a["blazar.audio.language"] = au.language
    return a


def _outcome_attributes(terminal: RequestCompleted | RequestFailed | RequestRejected) -> Attributes:
    a: Attributes = {}
    if isinstance(terminal, RequestCompleted):
        if terminal.prompt_tokens is not None:
            a["gen_ai.usage.input_tokens"] = terminal.prompt_tokens
        if terminal.completion_tokens is not None:
            a["gen_ai.usage.output_tokens"] = terminal.completion_tokens
        if terminal.finish_reason:
            a["gen_ai.response.finish_reasons"] = [terminal.finish_reason]
        a["gen_ai.response.model"] = terminal.model
    elif isinstance(terminal, RequestRejected):
        a.update({"error.type": terminal.reason, "blazar.refusal.reason": terminal.reason,
                  "blazar.refusal.detail": terminal.detail[:500]})
        if terminal.retry_after_s is not None:
            a["blazar.refusal.retry_after_s"] = terminal.retry_after_s
    else:
        a.update({"error.type": terminal.reason, "blazar.failure.reason": terminal.reason})
    return a
