"""The resource every inference route shares, whatever the dialect: read the body, let the dialect say what the
engine is asked (`ask`: validate, translate), add the request around it, hand the Request to `Gateway.serve`
(resolve, check the key's scope and limits, only then read the images and audio, load, admit, ask, record), and
render the Answer it gives back. Errors before the answer take the caller's shape (blazar/api/errors.py renders them
by route); an engine's refusal is re-shaped here the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any

import falcon
import falcon.asgi
import orjson

from blazar.api import bounds, disconnect, errors
from blazar.api.auth import principal_of
from blazar.api.context import trace_id_of
from blazar.api.request_options import request_options
from blazar.dialects.tools import constrain
from blazar.events.requests import Dialect
from blazar.serving.admission import parse_priority
from blazar.serving.gateway import Gateway
from blazar.serving.prefix import agent_of
from blazar.serving.request import Answer, Request
from blazar.serving.tenancy import IGNORED_HEADER, TENANT_HEADER, may_prioritize, qualify, tenant_of

SSE = "text/event-stream"


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
    """One inference route. Subclasses set `dialect` and implement `ask`."""

    dialect: Dialect = "openai"

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @abstractmethod
    def ask(self, data: dict[str, Any]) -> Request:
        """Validate the client's body and say what the engine is asked (a DialectError or ValidationError is a 400)."""

    def request_of(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, asked: Request, raw: bytes,
                   data: dict[str, Any]) -> Request:
        """What the dialect asked, with the request around it: trace id, caller and tenant, priority, Blazar's own
        options, the client's bytes."""
        try:
            priority = parse_priority(req.get_header("X-Blazar-Priority"))
        except ValueError as e:
            raise falcon.HTTPBadRequest(description=f"X-Blazar-Priority: {e}") from None
        forwarded_from = getattr(req.context, "forwarded_from", None)
        principal = principal_of(req)
        tenant = tenant_of(principal, req.get_header(TENANT_HEADER) if forwarded_from else None)
        opts = request_options(req, data, stream=asked.stream, chat=asked.engine_path == "/v1/chat/completions",
                               dialect=self.dialect)
        deadline_ms = opts.deadline_ms
        if (priority > 0 or deadline_ms is not None) and not may_prioritize(principal):
            # NOTE: ignored, not refused: a client that sends them everywhere still works; the answer says so. Going
            # behind others (a negative priority) is anyone's choice.
            ignored = [n for n, wanted in (("X-Blazar-Priority", priority > 0),
                                           ("X-Blazar-Deadline-Ms", deadline_ms is not None)) if wanted]
            priority, deadline_ms = min(priority, 0), None
            key = principal.key_name if principal is not None else None
            resp.set_header(IGNORED_HEADER, f"{', '.join(ignored)} (key {key} may not prioritize: `blazar keys "
                                            f"limits {key} --may-prioritize`)")
        parent_trace_id, parent_span_id = getattr(req.context, "traceparent", None) or (None, None)
        return replace(
            asked, trace_id=trace_id_of(req), dialect=self.dialect, path=req.path, raw=raw, parsed=data,
            priority=priority, client=req.remote_addr, agent=agent_of(req.get_header("User-Agent")),
            client_trace_id=getattr(req.context, "client_trace_id", None),
            parent_trace_id=parent_trace_id, parent_span_id=parent_span_id, principal=principal, tenant=tenant,
            forwarded_from=forwarded_from, session=qualify(tenant, opts.session), deadline_ms=deadline_ms,
            best_of=opts.best_of, cascade=opts.cascade, spec=opts.spec, cache=opts.cache,
            forced=constrain(asked.body) if asked.body is not None and asked.engine_path == "/v1/chat/completions"
            else None)

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raw, data = await read_json(req)
        asked = self.ask(data)
        bounds.check_name(asked.model)  # before anything is recorded: a bad name never reaches the log
        if asked.hooks.instead is not None:
            self.gateway.check_scope(principal_of(req), asked.model)  # a load is a use of the model too
            resp.media = await asked.hooks.instead()
            return
        request = self.request_of(req, resp, asked, raw, data)
        watcher = disconnect.watch(req)
        try:
            answer = await self.gateway.serve(request, watcher)
        except BaseException:
            disconnect.stop(watcher)
            raise
        self.render(req, resp, answer)

    def render(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, answer: Answer) -> None:
        resp.status = answer.status
        for name, value in answer.headers.items():  # an ignored field beside a priority the key may not ask
            (resp.append_header if name == IGNORED_HEADER else resp.set_header)(name, value)
        if answer.stream is not None:
            resp.content_type = answer.content_type or SSE
            resp.stream = answer.stream
        elif answer.refused is not None:
            self.engine_error(req, resp, answer)
        elif answer.data is not None:
            resp.content_type = answer.content_type or falcon.MEDIA_JSON
            resp.data = answer.data
        else:
            resp.media = answer.media

    def engine_error(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, answer: Answer) -> None:
        """The engine refused the request (a bad sampling value, a prompt over its context): its status, its words,
        the caller's shape (OpenAI's is the engine's own: passed on as it is)."""
        status = resp.status = answer.status
        if self.dialect == "openai" or answer.refusal is None:
            resp.content_type = falcon.MEDIA_JSON
            resp.data = answer.refused
            return
        message, code = answer.refusal
        payload = errors.body(message, status=status, code=code)
        payload["error"]["status"] = status
        resp.media = errors.in_dialect(req, payload)
