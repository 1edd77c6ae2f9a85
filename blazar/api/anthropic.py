"""The Anthropic dialect: `POST /v1/messages` (streamed or not) and `/v1/messages/count_tokens`, through the same
pipeline as every dialect. llama-server speaks Messages itself (its own event sequence, tools with `--jinja`), so
the body passes through and the engine's events are relayed untouched; errors take Anthropic's shape."""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from blazar.api.context import trace_id_of
from blazar.api.openai import _OpenAIBody, _Proxy
from blazar.errors import BlazarError
from blazar.handlers.gateway import Gateway, Rejected


class MessagesBody(_OpenAIBody):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(ge=1)  # required by the Messages API


class CountBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)


class Messages(_Proxy):
    body_model = MessagesBody
    route = "/v1/messages"
    dialect = "anthropic"

    def max_tokens(self, body: _OpenAIBody) -> int | None:
        assert isinstance(body, MessagesBody)
        return body.max_tokens


class CountTokens:
    """The engine's own count, template applied; the model is loaded if it is not (no slot is taken)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raw = await req.stream.read()
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise falcon.MediaMalformedError(falcon.MEDIA_JSON) from None
        body = CountBody.model_validate(data)
        gw = self.gateway
        try:
            inst = await gw.supervisor.ensure(gw.supervisor.resolve(body.model))
        except BlazarError as e:
            raise Rejected(e.message, status=404 if e.code == "model_not_found" else 503, code=e.code) from None
        status, answer = await gw.client.post_json(inst.base_url, "/v1/messages/count_tokens", data)
        resp.set_header("x-blazar-trace-id", trace_id_of(req))
        resp.status = status
        resp.media = answer


def add_routes(api: falcon.asgi.App, gateway: Gateway) -> None:
    api.add_route("/v1/messages", Messages(gateway))
    api.add_route("/v1/messages/count_tokens", CountTokens(gateway))
