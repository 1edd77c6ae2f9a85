"""The resource every inference route shares, whatever the dialect: read the body, let the dialect `plan` the engine
request (validate, translate), run it through the gateway's pipeline (resolve, load, admit, record), and send the
answer back: the engine's bytes untouched where the dialect is the engine's own (OpenAI), else translated event by
event (streams) or as one body. Errors before the answer take the caller's shape (blazar/api/errors.py renders them
by route); an engine error is re-shaped here the same way.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi
import orjson

from blazar.api import bounds, disconnect, errors
from blazar.api.auth import principal_of
from blazar.api.context import trace_id_of
from blazar.dialects.stream import Translator
from blazar.dialects.tools import Forced, ForcedStream, OpenAIStream, force
from blazar.handlers.admission import parse_priority
from blazar.handlers.gateway import Call, Gateway
from blazar.handlers.instances import UNSET

SSE = "text/event-stream"


@dataclass
class Plan:
    """What a dialect asks of the engine for one request, and how the answer goes back."""

    model: str
    path: str  # the engine route: /v1/chat/completions, /v1/completions, /v1/embeddings, ...
    body: dict[str, Any] | None  # the engine's body; None sends the client's bytes as they came
    stream: bool
    max_tokens: int | None = None
    ctx: int | None = None
    keep_alive: Any = UNSET
    embeddings: bool = False
    stream_as: Callable[[Call], Translator] | None = None  # None relays the engine's SSE untouched
    reply: Callable[[dict[str, Any], Call], Any] | None = None  # None answers the engine's bytes untouched
    forced: Forced | None = None
    # A request the dialect answers without the engine (Ollama's load-only request, nothing to embed): the answer.
    instead: Callable[[], Awaitable[dict[str, Any]]] | None = None


async def read_json(req: falcon.asgi.Request) -> tuple[bytes, dict[str, Any]]:
    """The body's bytes and its JSON object (a body that is not one is a 400 in the caller's shape)."""
    raw = await req.stream.read()
    try:
        data = bounds.loads(raw)  # the nesting bound: a 400 before any processing
    except orjson.JSONDecodeError:
        raise falcon.MediaMalformedError(falcon.MEDIA_JSON) from None
    if not isinstance(data, dict):
        raise falcon.HTTPBadRequest(description="the request body must be a JSON object")
    return raw, data


class Proxy(ABC):
    """One inference route. Subclasses set `dialect` and implement `plan`."""

    dialect = "openai"

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @abstractmethod
    def plan(self, data: dict[str, Any]) -> Plan:
        """Validate the client's body and say what the engine is asked (a DialectError or ValidationError is a 400)."""

    def call_for(self, req: falcon.asgi.Request, plan: Plan) -> Call:
        try:
            priority = parse_priority(req.get_header("X-Blazar-Priority"))
        except ValueError as e:
            raise falcon.HTTPBadRequest(description=f"X-Blazar-Priority: {e}") from None
        return Call(trace_id=trace_id_of(req), client_trace_id=getattr(req.context, "client_trace_id", None),
                    dialect=self.dialect, route=req.path, engine_path=plan.path,
                    model=plan.model, body=plan.body if plan.body is not None else {}, stream=plan.stream,
                    priority=priority, max_tokens=plan.max_tokens, embeddings=plan.embeddings, ctx=plan.ctx,
                    keep_alive=plan.keep_alive, principal=principal_of(req))

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raw, data = await read_json(req)
        plan = self.plan(data)
        if plan.instead is not None:
            bounds.check_name(plan.model)  # a load-only request names a model too: the same bound
            self.gateway.check_scope(principal_of(req), plan.model)  # a load is a use of the model too
            resp.media = await plan.instead()
            return
        await self.run(req, resp, plan, data, raw)

    async def run(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, plan: Plan, data: dict[str, Any],
                  raw: bytes) -> None:
        bounds.check_name(plan.model)  # before anything is recorded: a bad name never reaches the log
        if plan.body is not None and plan.path == "/v1/chat/completions":
            plan.forced = force(plan.body)
        call = self.call_for(req, plan)
        if plan.body is None:
            call.body = data
        await self.serve(req, resp, plan, call, raw if plan.body is None else orjson.dumps(plan.body))

    async def serve(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, plan: Plan, call: Call,
                    payload: bytes) -> None:
        gw = self.gateway
        gw.received(call, body_bytes=len(payload), client=req.remote_addr)
        watcher = disconnect.watch(req)
        try:
            await gw.prepare(call)
            if call.queue_position:
                resp.set_header("x-blazar-queue-position", str(call.queue_position))
            upstream = await gw.open_upstream(call, plan.path, payload)
        except asyncio.CancelledError:
            gw.fail(call, status=499, reason="client_disconnected", detail="the client closed the connection while "
                    "the request waited" + (" for a slot" if call.instance else " for the model to load"))
            raise
        except BaseException as e:
            disconnect.stop(watcher)
            # NOTE: every request.received ends with exactly one terminal event: a refusal recorded itself (Rejected
            # marks the call done); anything else that broke the pipeline is recorded here.
            gw.fail(call, status=500, reason="internal_error", detail=f"{type(e).__name__}: {e}")
            raise
        gw.guard(call, upstream)
        resp.status = upstream.status_code
        if call.stream and upstream.status_code == 200:
            translator = self.translator(plan, call)
            resp.content_type = translator.content_type if translator else upstream.headers.get("content-type", SSE)
            resp.set_header("cache-control", "no-cache")
            resp.stream = gw.relay(call, upstream, watcher, translator)
            return
        try:
            data = await gw.finish(call, upstream)
        finally:
            disconnect.stop(watcher)
        if upstream.status_code >= 400:
            self.engine_error(req, resp, upstream.status_code, data)
        elif plan.reply is None and plan.forced is None:
            resp.content_type = upstream.headers.get("content-type", falcon.MEDIA_JSON)
            resp.data = data
        else:
            answer = orjson.loads(data)
            if plan.forced is not None:
                answer = plan.forced.answer(answer)
            resp.media = plan.reply(answer, call) if plan.reply is not None else answer

    @staticmethod
    def translator(plan: Plan, call: Call) -> Translator | None:
        inner = plan.stream_as(call) if plan.stream_as is not None else None
        if plan.forced is None:
            return inner
        return ForcedStream(plan.forced, inner or OpenAIStream())

    def engine_error(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, status: int, data: bytes) -> None:
        """The engine refused the request (a bad sampling value, a prompt over its context): its status, its words,
        the caller's shape (OpenAI's is the engine's own: passed on as it is)."""
        resp.status = status
        if self.dialect == "openai":
            resp.content_type = falcon.MEDIA_JSON
            resp.data = data
            return
        try:
            err = orjson.loads(data).get("error") or {}
            message = str(err.get("message") or err) if isinstance(err, dict) else str(err)
            code = str(err.get("type") or "engine_error") if isinstance(err, dict) else "engine_error"
        except (orjson.JSONDecodeError, AttributeError):
            message, code = data[:500].decode(errors="replace"), "engine_error"
        payload = errors.body(message, status=status, code=code)
        payload["error"]["status"] = status
        resp.media = errors.in_dialect(req, payload)
