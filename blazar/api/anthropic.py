"""The Anthropic dialect: `POST /v1/messages` (streamed or not) and `/v1/messages/count_tokens`, through the same
pipeline as every dialect. Blazar translates (blazar/dialects/anthropic.py) rather than passing the body to the
engine's own Messages route, so a forced tool choice (`any`, `tool`) is enforced like OpenAI's, the stream carries
Anthropic's full event sequence (`ping` included), and every event is read for usage the same way."""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi

from blazar.api.auth import Access
from blazar.api.context import trace_id_of
from blazar.api.openai import HELLO, M
from blazar.api.proxy import Proxy, read_json
from blazar.api.routes import ENGINE, Op, Route, inference
from blazar.api.schemas import SSE, ref
from blazar.dialects import anthropic as dialect
from blazar.dialects.anthropic_body import CountBody, MessagesBody
from blazar.dialects.body import checked
from blazar.dialects.schema import check_tools
from blazar.errors import Refused
from blazar.serving.gateway import Gateway
from blazar.serving.request import Hooks, Request


class Messages(Proxy):
    dialect = "anthropic"

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        dialect.check_betas(req.get_header("anthropic-beta"))  # a feature the engine cannot honour: a 400 first
        await super().on_post(req, resp)

    def ask(self, data: dict[str, Any]) -> Request:
        body = dialect.to_openai(data)
        check_tools(body.get("tools"))
        model = data["model"]
        return Request(model=model, engine_path="/v1/chat/completions", body=body, stream=bool(body.get("stream")),
                    max_tokens=body.get("max_tokens"),
                    hooks=Hooks(stream_as=lambda call: dialect.MessagesStream(model),
                                reply=lambda answer, call: dialect.from_openai(answer, call.model)))


class CountTokens:
    """The engine's own count, template applied; the model is loaded if it is not (no slot is taken)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        dialect.check_betas(req.get_header("anthropic-beta"))
        _, data = await read_json(req)
        checked(CountBody, data)
        # NOTE: a count has no max_tokens for thinking's budget to be below; thinking adds nothing to the prompt
        body = dialect.to_openai({"max_tokens": 1, **{k: v for k, v in data.items() if k != "thinking"}})
        gw = self.gateway
        inst = await gw.supervisor.ensure(gw.supervisor.resolve(body["model"]))  # its errors render as they are
        n = await gw.client.count_tokens(inst.base_url, "/v1/chat/completions", body, api_key=inst.api_key)
        if n is None:
            raise Refused("the engine could not count this prompt's tokens", reason="engine_error", http_status=502)
        resp.set_header("x-blazar-trace-id", trace_id_of(req))
        resp.media = {"input_tokens": n}


ROUTES = (
    Route("/v1/messages", Access.KEY, lambda d: Messages(d.gateway), {"post": inference(
        "Messages", MessagesBody, "Message", SSE, examples=(
            {"model": M, "max_tokens": 64, "messages": HELLO},
            {"model": M, "max_tokens": 64, "messages": HELLO, "stream": True, "system": "Be brief."}))}),
    Route("/v1/messages/count_tokens", Access.KEY, lambda d: CountTokens(d.gateway), {"post": Op(
        "Count a prompt's tokens", ref("TokenCount"), statuses=ENGINE, body=CountBody,
        examples=({"model": M, "messages": HELLO},))}),
)
