"""The OpenAI dialect: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses.

Thin resources: validate the fields Blazar acts on (the rest passes through to llama-server untouched), build a
`Call`, run it through the gateway, and send the engine's bytes back as they are: SSE streams are relayed block by
block without re-encoding a chunk.
"""

from __future__ import annotations

import asyncio
from typing import Any

import falcon
import falcon.asgi
import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from blazar.api import disconnect
from blazar.api.context import trace_id_of
from blazar.bootstrap import Blazar
from blazar.handlers.admission import parse_priority
from blazar.handlers.gateway import Call, Gateway, Rejected
from blazar.projections.catalog import find

SSE = "text/event-stream"


class _OpenAIBody(BaseModel):
    # Unknown fields are the engine's business (sampling, tools, response_format, ...): passed on as sent.
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1)
    stream: StrictBool = False


class ChatBody(_OpenAIBody):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionBody(_OpenAIBody):
    prompt: str | list[Any]
    max_tokens: int | None = Field(None, ge=1)


class EmbeddingBody(_OpenAIBody):
    input: str | list[Any]


class ResponsesBody(_OpenAIBody):
    input: str | list[Any]
    max_output_tokens: int | None = Field(None, ge=1)


class _Proxy:
    """One OpenAI route: validate, run the call, relay."""

    body_model: type[_OpenAIBody]
    route: str
    dialect = "openai"
    embeddings = False

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def max_tokens(self, body: _OpenAIBody) -> int | None:
        return None

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raw = await req.stream.read()
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise falcon.MediaMalformedError(falcon.MEDIA_JSON) from None
        parsed = self.body_model.model_validate(data)
        try:
            priority = parse_priority(req.get_header("X-Blazar-Priority"))
        except ValueError as e:
            raise falcon.HTTPBadRequest(description=f"X-Blazar-Priority: {e}") from None
        call = Call(trace_id=trace_id_of(req), dialect=self.dialect, route=self.route, model=parsed.model, body=data,
                    stream=parsed.stream, priority=priority, max_tokens=self.max_tokens(parsed),
                    embeddings=self.embeddings)
        gw = self.gateway
        gw.received(call, body_bytes=len(raw), client=req.remote_addr)
        watcher = disconnect.watch(req)
        try:
            await gw.prepare(call)
            if call.queue_position:
                resp.set_header("x-blazar-queue-position", str(call.queue_position))
            upstream = await gw.open_upstream(call, self.route, raw)
        except asyncio.CancelledError:
            gw.fail(call, status=499, reason="client_disconnected", detail="the client closed the connection while "
                    "the request waited" + (" for a slot" if call.instance else " for the model to load"))
            raise
        except BaseException:
            disconnect.stop(watcher)
            raise
        gw.guard(call, upstream)
        resp.status = upstream.status_code
        if call.stream and upstream.status_code == 200:
            resp.content_type = upstream.headers.get("content-type", SSE)
            resp.set_header("cache-control", "no-cache")
            resp.stream = gw.relay(call, upstream, watcher)
            return
        resp.content_type = upstream.headers.get("content-type", falcon.MEDIA_JSON)
        try:
            resp.data = await gw.finish(call, upstream)
        finally:
            disconnect.stop(watcher)


class ChatCompletions(_Proxy):
    body_model = ChatBody
    route = "/v1/chat/completions"

    def max_tokens(self, body: _OpenAIBody) -> int | None:
        assert isinstance(body, ChatBody)
        return body.max_completion_tokens or body.max_tokens


class Completions(_Proxy):
    body_model = CompletionBody
    route = "/v1/completions"

    def max_tokens(self, body: _OpenAIBody) -> int | None:
        assert isinstance(body, CompletionBody)
        return body.max_tokens


class Embeddings(_Proxy):
    body_model = EmbeddingBody
    route = "/v1/embeddings"
    embeddings = True


class Responses(_Proxy):
    body_model = ResponsesBody
    route = "/v1/responses"

    def max_tokens(self, body: _OpenAIBody) -> int | None:
        assert isinstance(body, ResponsesBody)
        return body.max_output_tokens


class Models:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        models = self.app.runner.state("catalog")["models"].values()
        resp.media = {"object": "list", "data": [
            {"id": m["name"], "object": "model", "created": int(m.get("added_ts") or 0), "owned_by": "blazar"}
            for m in sorted(models, key=lambda m: m["name"])]}


class Model:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model_id: str) -> None:
        m = find(self.app.runner.state("catalog"), model_id)
        if m is None:
            raise Rejected(f"The model '{model_id}' does not exist", status=404, code="model_not_found")
        resp.media = {"id": m["name"], "object": "model", "created": int(m.get("added_ts") or 0),
                      "owned_by": "blazar"}


def add_routes(api: falcon.asgi.App, app: Blazar, gateway: Gateway) -> None:
    api.add_route("/v1/models", Models(app))
    api.add_route("/v1/models/{model_id}", Model(app))
    api.add_route("/v1/chat/completions", ChatCompletions(gateway))
    api.add_route("/v1/completions", Completions(gateway))
    api.add_route("/v1/embeddings", Embeddings(gateway))
    api.add_route("/v1/responses", Responses(gateway))
