"""The request pipeline every dialect shares: resolve the model, get a ready instance (loading it on demand), refuse
what cannot fit its context, take a slot (or wait for one), relay the engine's answer, and record each step as a
request event through the group-commit writer (never awaited on the token path).

A dialect's resource builds a `Call`, then: `prepare` → `open_upstream` → either `relay` (a stream: the engine's
bytes as they come) or `finish` (one body). Every exit path releases the slot and records how the request ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson

from blazar.adapters.engines.client import EngineClient
from blazar.context import Blazar
from blazar.dialects.stream import SseEvents, Translator
from blazar.errors import BlazarError, EngineError, ModelNotFound, http_status
from blazar.events.base import Event
from blazar.events.requests import (
    RequestAdmitted,
    RequestCompleted,
    RequestFailed,
    RequestFirstToken,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRouted,
)
from blazar.handlers.admission import Admission, AdmissionError, Ticket
from blazar.handlers.instances import UNSET, Instance, Route
from blazar.handlers.limits import Lease, Limiter, LimitExceeded
from blazar.handlers.ports import SupervisorPort
from blazar.handlers.principal import Principal, scope_refusal

log = logging.getLogger("blazar.gateway")

# The prompt's upper bound in tokens is its UTF-8 size (a token is at least one byte) plus the chat template's
# own tokens; under this margin of the context no exact count is needed.
TEMPLATE_TOKENS_PER_MESSAGE = 16
TEMPLATE_TOKENS_BASE = 64


class Rejected(BlazarError):
    """A request refused before any token: `status`, a stable `code`, and Retry-After where waiting helps."""

    def __init__(self, message: str, *, status: int, code: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after_s = retry_after_s


@dataclass
class Call:
    """One API request on its way through the pipeline."""

    trace_id: str
    dialect: str
    route: str  # the client's route: /v1/chat/completions, /v1/messages, /api/chat, ...
    model: str  # as the client named it
    body: dict[str, Any]
    stream: bool = False
    priority: int = 0
    max_tokens: int | None = None
    embeddings: bool = False
    ctx: int | None = None  # the context per slot the caller asked for (Ollama's num_ctx): any covering instance
    keep_alive: Any = UNSET  # the caller's keep_alive for the model (Ollama's), else the instance's own
    received: float = field(default_factory=time.perf_counter)
    load_ms: float | None = None  # the cold load this request waited for, if any
    name: str | None = None  # the store's name, once resolved
    instance: Instance | None = None
    ticket: Ticket | None = None
    held: bool = False
    first_token_at: float | None = None
    queue_position: int = 0
    done: bool = False
    engine_path: str = ""  # the engine route that serves it (/v1/chat/completions for every chat dialect)
    client_trace_id: str | None = None  # the client's x-blazar-trace-id when it was already used (a fresh one given)
    principal: Principal | None = None  # who is calling (blazar/api/auth.py); None while auth is off
    lease: Lease | None = None  # the key's concurrency lease, held until the answer ends

    @property
    def actor(self) -> str | None:
        return self.principal.actor if self.principal is not None else None


class Gateway:
    def __init__(self, app: Blazar, supervisor: SupervisorPort, admission: Admission, client: EngineClient) -> None:
        self.app = app
        self.supervisor = supervisor
        self.admission = admission
        self.client = client
        self._writer = app.request_writer()
        self._actor = app.actor
        self.limits = Limiter(app.clock, seed=self._tokens_today)

    def _tokens_today(self, key_name: str, day: int) -> int:
        """What the log says a key used on UTC day `day` (a restarted daemon keeps counting the daily limit)."""
        usage = self.app.runner.state("metrics").get("keys", {}).get(key_name) or {}
        return int(usage.get("tokens_today", 0)) if usage.get("day") == day else 0

    def emit(self, event: Event, trace_id: str, actor: str | None = None) -> None:
        """Hand a request event to the group-commit writer; its actor is the caller's key ("key:<name>") where keys
        are on, else the daemon's."""
        self._writer.submit(event, actor=actor or self._actor, trace_id=trace_id)

    # -- before the engine --------------------------------------------------------------------------------------

    def received(self, call: Call, *, body_bytes: int, client: str | None) -> None:
        self.emit(RequestReceived(trace_id=call.trace_id, dialect=call.dialect, route=call.route, model=call.model,  # type: ignore[arg-type]
                                  stream=call.stream, body_bytes=body_bytes, priority=call.priority,
                                  max_tokens=call.max_tokens, client=client,
                                  client_trace_id=call.client_trace_id), call.trace_id, call.actor)

    def reject(self, call: Call, *, status: int, reason: str, detail: str, retry_after_s: float | None = None,
               observations: dict[str, Any] | None = None) -> Rejected:
        """Record the refusal (the request's one terminal event) and return the error to raise."""
        call.done = True
        self.emit(RequestRejected(trace_id=call.trace_id, model=call.name or call.model, status=status,
                                  reason=reason, detail=detail, retry_after_s=retry_after_s,  # type: ignore[arg-type]
                                  observations=observations or {}), call.trace_id, call.actor)
        return Rejected(detail, status=status, code=reason, retry_after_s=retry_after_s)

    async def prepare(self, call: Call) -> None:
        """Resolve, route (loading on demand), check the context, admit. Raises Rejected, recorded."""
        try:
            call.name = self.supervisor.resolve(call.model)
        except ModelNotFound as e:
            raise self.reject(call, status=404, reason="model_not_found", detail=e.message) from None
        self._authorize(call)
        try:
            await self._run_prepared(call)
        except BaseException:
            self._drop_lease(call)  # whatever refused or broke it before the answer: the lease is not kept
            raise

    def _authorize(self, call: Call) -> None:
        """The caller's key: is the model in its scope (by the client's name or the store's), and do its limits
        allow one more request now? Takes the key's concurrency lease."""
        p = call.principal
        if p is None or p.key is None:
            return
        assert call.name is not None
        if not p.allows(call.model, call.name):
            err = self.reject(call, status=403, reason="model_not_allowed", detail=scope_refusal(p, call.model,
                              call.name), observations={"key": p.key_name, "models": list(p.key.get("models") or [])})
            err.error_type = "permission_error"  # type: ignore[attr-defined]
            raise err
        limits = p.limits()
        assert limits is not None
        try:
            call.lease = self.limits.acquire(limits)
        except LimitExceeded as e:
            raise self.reject(call, status=429, reason="rate_limit_exceeded", detail=e.message,
                              retry_after_s=e.retry_after_s,
                              observations={"key": p.key_name, "limit": e.limit, "value": e.value}) from None

    def check_scope(self, principal: Principal | None, model: str) -> None:
        """The scope check alone, for what a dialect answers without the pipeline (Ollama's load or unload)."""
        if principal is None or principal.key is None:
            return
        try:
            name = self.supervisor.resolve(model)
        except ModelNotFound:
            name = model
        if not principal.allows(model, name):
            err = Rejected(scope_refusal(principal, model, name), status=403, code="model_not_allowed")
            err.error_type = "permission_error"  # type: ignore[attr-defined]
            raise err

    def _drop_lease(self, call: Call) -> None:
        if call.lease is not None:
            self.limits.release(call.lease)
            call.lease = None

    async def _run_prepared(self, call: Call) -> None:
        assert call.name is not None
        route = Route()
        try:
            inst = await self.supervisor.ensure(call.name, ctx=call.ctx, keep_alive=call.keep_alive,
                                                embeddings=call.embeddings, route=route)
        except BlazarError as e:
            status, reason = http_status(e)
            raise self.reject(call, status=status, reason=reason, detail=e.message) from None
        call.instance = inst
        call.load_ms = route.load_ms if route.cold else None
        self.emit(RequestRouted(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                port=inst.port, cold=route.cold, load_ms=route.load_ms, evicted=route.evicted,
                                ctx_tokens=inst.ctx_tokens), call.trace_id, call.actor)
        await self._check_context(call, inst)

        def on_queued(position: int, depth: int) -> None:
            call.queue_position = position
            snap = self.admission.snapshot().get(inst.model, {})
            self.emit(RequestQueued(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                    position=position, depth=depth, slots=inst.slots,
                                    busy=int(snap.get("busy", 0))), call.trace_id, call.actor)

        try:
            ticket = await self.admission.acquire(inst.model, inst.slots, priority=call.priority,
                                                  on_queued=on_queued)
        except AdmissionError as e:
            raise self.reject(call, status=e.status, reason=e.reason, detail=e.message,
                              retry_after_s=e.retry_after_s, observations=e.observations) from None
        call.ticket = ticket
        try:
            self.supervisor.hold(inst)
        except BlazarError as e:
            self.admission.release(ticket)
            call.ticket = None
            status, reason = http_status(e)
            raise self.reject(call, status=status, reason=reason, detail=e.message) from None
        call.held = True
        self.emit(RequestAdmitted(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                  waited_ms=round(ticket.waited_s * 1000, 3), slots=ticket.slots,
                                  busy=ticket.busy_after, queued_behind=max(0, ticket.position_when_queued - 1)),
                  call.trace_id, call.actor)

    async def _check_context(self, call: Call, inst: Instance) -> None:
        """Prompt plus max_tokens must fit the slot's context: a clear 400, never silent truncation. The exact count
        (the engine's tokenizer, template applied) is asked only when a cheap upper bound does not settle it."""
        if call.embeddings:
            return
        need_out = call.max_tokens or 0
        if _prompt_upper_bound(call.body) + need_out <= inst.ctx_tokens:
            return
        try:
            n = await self.client.count_tokens(inst.base_url, call.engine_path or call.route, call.body,
                                              api_key=inst.api_key)
        except EngineError as e:
            log.warning("token count failed for %s: %s", inst.model, e)
            return  # the engine refuses an oversized prompt itself
        if n is None:
            return
        if n + need_out > inst.ctx_tokens or n >= inst.ctx_tokens:
            detail = (f"this request needs {n} prompt tokens + {need_out} max_tokens = {n + need_out} tokens, but "
                      f"{inst.model}'s context is {inst.ctx_tokens} tokens per request; shorten the prompt or lower "
                      "max_tokens")
            raise self.reject(call, status=400, reason="context_length_exceeded", detail=detail,
                              observations={"prompt_tokens": n, "max_tokens": need_out, "ctx_tokens": inst.ctx_tokens})

    # -- the engine's answer ------------------------------------------------------------------------------------

    async def open_upstream(self, call: Call, path: str, body: bytes) -> httpx2.Response:
        assert call.instance is not None
        try:
            return await self.client.open(call.instance.base_url, path, body, api_key=call.instance.api_key)
        except EngineError as e:
            self.fail(call, status=502, reason="engine_error", detail=e.message)
            raise Rejected(e.message, status=502, code="engine_error") from None

    def guard(self, call: Call, upstream: httpx2.Response) -> None:
        """Whatever ends the request's task (a hang-up before the first byte was sent, an error in the server), the
        slot is released and the engine request closed: nothing relies on the relay having started."""
        task = asyncio.current_task()
        if task is None:
            return

        def settle(_: asyncio.Task[Any]) -> None:
            if not call.done:
                self.fail(call, status=499, reason="client_disconnected",
                          detail="the request ended before its answer was sent")
            if not upstream.is_closed:
                closing = asyncio.ensure_future(upstream.aclose())
                closing.add_done_callback(lambda f: f.cancelled() or f.exception())

        task.add_done_callback(settle)

    async def relay(self, call: Call, upstream: httpx2.Response, watcher: asyncio.Task[None] | None = None,
                    translator: Translator | None = None) -> AsyncIterator[bytes]:
        """The engine's stream as it arrives: its SSE bytes untouched (OpenAI), or each event through `translator`
        (another dialect). Usage is read from the last events (llama-server puts `timings` and, when asked, `usage`
        there); the first non-empty block marks the first token."""
        tail = b""
        head = b""  # Anthropic's message_start carries the input usage, at the very beginning
        chunks = 0
        usage: dict[str, Any] = {}
        broke: str | None = None
        events = SseEvents() if translator is not None else None
        try:
            async for block in upstream.aiter_raw():
                if call.first_token_at is None:
                    self._first_token(call)
                    head = block[:8192] if b'"usage"' in block else b""
                chunks += block.count(b"data: ")
                if events is None:
                    keep = b'"timings"' in block or b'"usage"' in block or b'"error"' in block or tail
                    tail = (tail + block)[-8192:] if keep else tail
                    if b"data: [DONE]" in block:
                        # NOTE: the answer is whole once [DONE] goes out: record it before the client, which may
                        # hang up at once, can turn the end of the relay into a disconnect.
                        self._end_raw(call, head, tail, status=upstream.status_code, chunks=chunks)
                    yield block
                    continue
                assert translator is not None
                out = []
                for event in events.feed(block):
                    if "error" in event and not event.get("choices"):  # the engine gave up mid-stream
                        broke = _error_message(event["error"])
                        break
                    if "timings" in event or "usage" in event:
                        _merge_usage(usage, usage_from_json(event))
                    out.append(translator.event(event))
                data = b"".join(out)
                if broke is not None:
                    self.fail(call, status=502, reason="engine_error", detail=broke)
                    yield data + translator.error(broke)
                    return
                if data:
                    yield data
        except (httpx2.TransportError, httpx2.StreamError) as e:
            self.fail(call, status=502, reason="engine_crashed", detail=f"the engine's stream broke: {e}")
            if translator is not None:
                yield translator.error(f"the engine's stream broke: {e}")
            return
        except Exception as e:  # a bug on our side of the relay: recorded as such, never as the client's hang-up
            log.exception("relaying %s failed", call.trace_id)
            self.fail(call, status=500, reason="internal_error", detail=f"{type(e).__name__}: {e}")
            raise
        except BaseException:
            # GeneratorExit / CancelledError: the client went away; closing the upstream cancels the generation.
            self.fail(call, status=499, reason="client_disconnected", detail="the client closed the connection")
            raise
        finally:
            if watcher is not None:
                watcher.cancel()  # the response is over: a later hang-up must not cancel what comes next
            await upstream.aclose()
        if translator is not None:
            self._complete(call, usage, status=upstream.status_code, chunks=chunks)
            yield translator.end()
            return
        self._end_raw(call, head, tail, status=upstream.status_code, chunks=chunks)

    def _end_raw(self, call: Call, head: bytes, tail: bytes, *, status: int, chunks: int) -> None:
        """The outcome of a relayed (untranslated) stream, from its first and last events: failed when the engine
        sent an error event, else completed with the usage found there. Once only (a done call is left as it is)."""
        broke = _stream_error(tail) if b'"error"' in tail else None
        if broke is not None:  # the client got the engine's error event as it was; the request failed
            self.fail(call, status=502, reason="engine_error", detail=broke)
            return
        self._complete(call, usage_from_sse(head + b"\n" + tail if head else tail), status=status, chunks=chunks)

    async def finish(self, call: Call, upstream: httpx2.Response) -> bytes:
        """Read a whole (non-stream or error) body, record the outcome, release."""
        try:
            data = await upstream.aread()
        except (httpx2.TransportError, httpx2.StreamError) as e:
            self.fail(call, status=502, reason="engine_crashed", detail=f"the engine's answer broke: {e}")
            raise Rejected(f"the engine's answer broke: {e}", status=502, code="engine_error") from None
        except BaseException:
            self.fail(call, status=499, reason="client_disconnected", detail="the client closed the connection")
            raise
        finally:
            await upstream.aclose()
        if upstream.status_code >= 400:
            self.fail(call, status=upstream.status_code, reason="engine_error", detail=_engine_message(data))
            return data
        self._first_token(call)
        try:
            usage = usage_from_json(orjson.loads(data))
        except orjson.JSONDecodeError:
            usage = {}
        self._complete(call, usage, status=upstream.status_code)
        return data

    # -- outcomes -------------------------------------------------------------------------------------------------

    def _first_token(self, call: Call) -> None:
        call.first_token_at = time.perf_counter()
        self.emit(RequestFirstToken(trace_id=call.trace_id, model=call.name or call.model,
                                    ttft_ms=round((call.first_token_at - call.received) * 1000, 3)),
                  call.trace_id, call.actor)

    def _complete(self, call: Call, usage: dict[str, Any], *, status: int, chunks: int | None = None) -> None:
        if call.done:
            return
        self._release(call)
        key_name = call.principal.key_name if call.principal is not None else None
        if key_name is not None:  # the key's tpm and daily_tokens count a request's tokens when it completes
            self.limits.add_tokens(key_name, int(usage.get("prompt_tokens") or 0)
                                   + int(usage.get("completion_tokens") or 0))
        self.emit(RequestCompleted(
            trace_id=call.trace_id, model=call.name or call.model,
            instance_id=call.instance.instance_id if call.instance else None, status=status,
            duration_ms=round((time.perf_counter() - call.received) * 1000, 3),
            prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
            cached_tokens=usage.get("cached_tokens"), engine_timings=usage.get("timings") or {},
            finish_reason=usage.get("finish_reason"), chunks=chunks), call.trace_id, call.actor)

    def fail(self, call: Call, *, status: int, reason: str, detail: str) -> None:
        if call.done:
            return
        self._release(call)
        self.emit(RequestFailed(trace_id=call.trace_id, model=call.name or call.model,
                                instance_id=call.instance.instance_id if call.instance else None, status=status,
                                reason=reason, detail=detail[:500],  # type: ignore[arg-type]
                                duration_ms=round((time.perf_counter() - call.received) * 1000, 3)),
                  call.trace_id, call.actor)

    def _release(self, call: Call) -> None:
        call.done = True
        self._drop_lease(call)
        if call.ticket is not None:
            self.admission.release(call.ticket)
            call.ticket = None
        if call.held and call.instance is not None:
            self.supervisor.unhold(call.instance)
            call.held = False


def _merge_usage(found: dict[str, Any], got: dict[str, Any]) -> None:
    """A later event's usage wins, but a finish reason seen earlier is not lost to an event without one."""
    reason = found.get("finish_reason")
    found.update(got)
    if reason and not got.get("finish_reason"):
        found["finish_reason"] = reason


def _prompt_upper_bound(body: dict[str, Any]) -> int:
    """Tokens the prompt can at most take: every text byte a token, plus the template's share."""
    total = TEMPLATE_TOKENS_BASE
    for key in ("messages", "input"):
        items = body.get(key)
        if isinstance(items, list):
            total += TEMPLATE_TOKENS_PER_MESSAGE * len(items) + len(orjson.dumps(items))
        elif isinstance(items, str):
            total += len(items.encode())
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        total += len(prompt.encode())
    elif isinstance(prompt, list):
        total += len(orjson.dumps(prompt))
    for key in ("tools", "system", "instructions"):
        if body.get(key):
            total += len(orjson.dumps(body[key]))
    return total


def usage_from_json(data: Any) -> dict[str, Any]:
    """prompt/completion/cached tokens and the engine's timings from an OpenAI-shaped answer."""
    if not isinstance(data, dict):
        return {}
    out: dict[str, Any] = {}
    usage = data.get("usage")
    if usage is None and isinstance(data.get("message"), dict):  # Anthropic's message_start
        usage = data["message"].get("usage")
    if usage is None and isinstance(data.get("response"), dict):  # the Responses API's response.completed
        usage = data["response"].get("usage")
    if isinstance(usage, dict):
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        cache_read = usage.get("cache_read_input_tokens")
        if isinstance(prompt, int) and isinstance(cache_read, int):  # Anthropic counts cached input apart
            prompt += cache_read
            out["cached_tokens"] = cache_read
        out["prompt_tokens"] = prompt
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        if completion or data.get("type") != "message_start":  # message_start says 0 before any output
            out["completion_tokens"] = completion
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            out["cached_tokens"] = details.get("cached_tokens")
    timings = data.get("timings")
    if isinstance(timings, dict):
        out["timings"] = {k: float(v) for k, v in timings.items() if isinstance(v, int | float)}
        out.setdefault("completion_tokens", timings.get("predicted_n"))
        if out.get("prompt_tokens") is None and "prompt_n" in timings:
            out["prompt_tokens"] = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
        if out.get("cached_tokens") is None and "cache_n" in timings:
            out["cached_tokens"] = timings.get("cache_n")
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        out["finish_reason"] = choices[0].get("finish_reason")
    delta = data.get("delta")  # Anthropic's is an object; the Responses API's output_text.delta is a string
    stop = data.get("stop_reason") or (delta.get("stop_reason") if isinstance(delta, dict) else None)
    if stop:
        out["finish_reason"] = stop
    return {k: v for k, v in out.items() if v is not None}


def usage_from_sse(tail: bytes) -> dict[str, Any]:
    """Usage from the last events of a stream: the one with `usage` wins, else the one with `timings`."""
    found: dict[str, Any] = {}
    for line in tail.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        try:
            data = orjson.loads(line[6:])
        except orjson.JSONDecodeError:
            continue  # the first line of the kept tail may be cut
        got = usage_from_json(data)
        if got:
            _merge_usage(found, got)
    return found


def _error_message(err: Any) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


def _stream_error(tail: bytes) -> str | None:
    """The engine's in-stream error event (`data: {"error": ...}`) among the last events, if it sent one."""
    for line in tail.split(b"\n"):
        if line.startswith(b'data: {"error"'):
            try:
                return _error_message(orjson.loads(line[6:]).get("error"))
            except (orjson.JSONDecodeError, AttributeError):
                return line[6:300].decode(errors="replace")
    return None


def _engine_message(data: bytes) -> str:
    try:
        err = orjson.loads(data).get("error", {})
        return str(err.get("message") or data[:300].decode(errors="replace"))
    except (orjson.JSONDecodeError, AttributeError):
        return data[:300].decode(errors="replace")
