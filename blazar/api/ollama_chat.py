"""The Ollama dialect's inference routes: /api/chat, /api/generate (NDJSON streams by default), /api/embed and the
legacy /api/embeddings, translated by blazar/dialects/ollama.py and run through the same pipeline as every dialect.
A chat or generate request with nothing to generate only loads the model (or, with `keep_alive: 0`, unloads it), as
Ollama does."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import falcon
import falcon.asgi

from blazar.api.proxy import Plan, Proxy, read_json
from blazar.dialects import ollama as dialect
from blazar.dialects.schema import check_schema, check_tools
from blazar.errors import ModelNotLoaded
from blazar.handlers.gateway import Gateway


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class _Generation(Proxy):
    dialect = "ollama"
    reply_key = "message"
    stream_class: type[dialect.ChatStream] | type[dialect.GenerateStream]
    answer: Callable[[dict[str, Any], str, Any], dict[str, Any]]

    def request(self, data: dict[str, Any]) -> dialect.ChatPlan:
        raise NotImplementedError

    def plan_for(self, cp: dialect.ChatPlan) -> Plan:
        stream_class, answer = self.stream_class, self.answer
        return Plan(model=cp.model, path=cp.engine_path, body=cp.engine_body, stream=cp.stream,
                    max_tokens=cp.max_tokens, ctx=cp.ctx, keep_alive=cp.keep_alive,
                    stream_as=lambda call: stream_class(cp.model, call),
                    reply=lambda reply, call: answer(reply, cp.model, call))

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raw, data = await read_json(req)
        cp = self.request(data)
        if isinstance(data.get("format"), dict):
            check_schema(data["format"], "format")
        check_tools(cp.engine_body.get("tools"))
        if cp.empty:
            resp.media = await self.load_or_unload(cp)
            return
        await self.run(req, resp, self.plan_for(cp), data, raw)

    async def load_or_unload(self, cp: dialect.ChatPlan) -> dict[str, Any]:
        """An empty request: load the model (with its keep_alive and num_ctx), or unload it for keep_alive 0."""
        sup = self.gateway.supervisor
        name = sup.resolve(cp.model)
        if cp.keep_alive == 0:
            with contextlib.suppress(ModelNotLoaded):  # unloading what is not loaded is done already
                await sup.stop(name)
            reason = "unload"
        else:
            await sup.ensure(name, ctx=cp.ctx, keep_alive=cp.keep_alive, reason="request")
            reason = "load"
        empty: Any = {"role": "assistant", "content": ""} if self.reply_key == "message" else ""
        return {"model": cp.model, "created_at": _now(), self.reply_key: empty, "done": True, "done_reason": reason}


class Chat(_Generation):
    stream_class = dialect.ChatStream
    answer = staticmethod(dialect.chat_reply)

    def request(self, data: dict[str, Any]) -> dialect.ChatPlan:
        return dialect.chat_request(data)


class Generate(_Generation):
    reply_key = "response"
    stream_class = dialect.GenerateStream
    answer = staticmethod(dialect.generate_reply)

    def request(self, data: dict[str, Any]) -> dialect.ChatPlan:
        return dialect.generate_request(data)


class Embed(Proxy):
    dialect = "ollama"

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raw, data = await read_json(req)
        model, body, keep_alive, _ = dialect.embed_request(data)
        if body["input"] in ("", []):  # nothing to embed: Ollama answers at once (and loads nothing)
            resp.media = {"model": model, "embeddings": []}
            return
        dims = body.pop("dimensions", None)
        plan = Plan(model=model, path="/v1/embeddings", body=body, stream=False, keep_alive=keep_alive,
                    embeddings=True, reply=lambda answer, call: dialect.embed_reply(answer, model, call, dims))
        await self.run(req, resp, plan, data, raw)


class Embeddings(Proxy):
    dialect = "ollama"

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raw, data = await read_json(req)
        model, body, keep_alive = dialect.embeddings_request(data)
        if body["input"] == "":
            resp.media = {"embedding": []}
            return
        plan = Plan(model=model, path="/v1/embeddings", body=body, stream=False, keep_alive=keep_alive,
                    embeddings=True, reply=lambda answer, call: dialect.embeddings_reply(answer))
        await self.run(req, resp, plan, data, raw)


def add_routes(api: falcon.asgi.App, gateway: Gateway) -> None:
    api.add_route("/api/chat", Chat(gateway))
    api.add_route("/api/generate", Generate(gateway))
    api.add_route("/api/embed", Embed(gateway))
    api.add_route("/api/embeddings", Embeddings(gateway))
