"""The Ollama dialect's inference routes: /api/chat, /api/generate (NDJSON streams by default), /api/embed and the
legacy /api/embeddings, translated by blazar/dialects/ollama.py and run through the same pipeline as every dialect.
A chat or generate request with nothing to generate only loads the model (or, with `keep_alive: 0`, unloads it), as
Ollama does."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from blazar.api.auth import Access
from blazar.api.openai import HELLO, M
from blazar.api.proxy import Proxy
from blazar.api.routes import Route, inference
from blazar.api.schemas import NDJSON
from blazar.dialects import ollama as ollama_dialect
from blazar.dialects.ollama_body import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest
from blazar.dialects.schema import check_schema, check_tools
from blazar.errors import ModelNotLoaded
from blazar.serving.request import Hooks, Request


class _Generation(Proxy):
    """/api/chat and /api/generate: the same plan, each with its own translation, stream and reply."""

    dialect = "ollama"
    chat: bool
    translate: Callable[[dict[str, Any]], ollama_dialect.ChatTranslation]
    stream_class: type[ollama_dialect.ChatStream] | type[ollama_dialect.GenerateStream]
    answer: Callable[[dict[str, Any], str, Any, int], dict[str, Any]]

    def ask(self, data: dict[str, Any]) -> Request:
        cp = self.translate(data)
        if isinstance(data.get("format"), dict):
            check_schema(data["format"], "format")
        check_tools(cp.engine_body.get("tools"))
        stream_class, answer = self.stream_class, self.answer
        return Request(model=cp.model, engine_path=cp.engine_path, body=cp.engine_body, stream=cp.stream,
                    max_tokens=cp.max_tokens, ctx=cp.ctx, keep_alive=cp.keep_alive,
                    hooks=Hooks(stream_as=lambda call: stream_class(cp.model, call, cp.top_logprobs),
                                reply=lambda reply, call: answer(reply, call.model, call, cp.top_logprobs),
                                instead=(lambda: self.load_or_unload(cp)) if cp.empty else None))

    async def load_or_unload(self, cp: ollama_dialect.ChatTranslation) -> dict[str, Any]:
        """An empty request: load the model (with its keep_alive and num_ctx), or unload it for keep_alive 0."""
        sup = self.gateway.supervisor
        model = sup.resolve(cp.model)
        if cp.keep_alive == 0:
            with contextlib.suppress(ModelNotLoaded):  # unloading what is not loaded is done already
                await sup.stop(model.name)
            return ollama_dialect.done_without_engine(cp.model, "unload", chat=self.chat)
        await sup.ensure(model, ctx=cp.ctx, keep_alive=cp.keep_alive, reason="request")
        return ollama_dialect.done_without_engine(cp.model, "load", chat=self.chat)


class Chat(_Generation):
    chat = True
    translate = staticmethod(ollama_dialect.chat_request)
    stream_class = ollama_dialect.ChatStream
    answer = staticmethod(ollama_dialect.chat_reply)


class Generate(_Generation):
    chat = False
    translate = staticmethod(ollama_dialect.generate_request)
    stream_class = ollama_dialect.GenerateStream
    answer = staticmethod(ollama_dialect.generate_reply)


async def _answer(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


class Embed(Proxy):
    dialect = "ollama"

    def ask(self, data: dict[str, Any]) -> Request:
        model, body, keep_alive, _ = ollama_dialect.embed_request(data)
        dims = body.pop("dimensions", None)
        empty = body["input"] in ("", [])  # nothing to embed: Ollama answers at once (and loads nothing)
        return Request(model=model, engine_path="/v1/embeddings", body=body, stream=False, keep_alive=keep_alive,
                    embeddings=True,
                    hooks=Hooks(reply=lambda answer, call: ollama_dialect.embed_reply(answer, model, call, dims),
                                instead=(lambda: _answer({"model": model, "embeddings": []})) if empty else None))


class Embeddings(Proxy):
    dialect = "ollama"

    def ask(self, data: dict[str, Any]) -> Request:
        model, body, keep_alive = ollama_dialect.embeddings_request(data)
        return Request(model=model, engine_path="/v1/embeddings", body=body, stream=False, keep_alive=keep_alive,
                    embeddings=True,
                    hooks=Hooks(reply=lambda answer, call: ollama_dialect.embeddings_reply(answer),
                                instead=(lambda: _answer({"embedding": []})) if body["input"] == "" else None))


_WHY = "Why is the sky blue?"
ROUTES = (
    Route("/api/chat", Access.KEY, lambda d: Chat(d.gateway), {"post": inference(
        "Chat", ChatRequest, "ChatResponse", NDJSON, examples=(
            {"model": M, "messages": HELLO},
            {"model": M, "messages": HELLO, "stream": False, "options": {"num_predict": 16}}))}),
    Route("/api/generate", Access.KEY, lambda d: Generate(d.gateway), {"post": inference(
        "Generate", GenerateRequest, "GenerateResponse", NDJSON, examples=(
            {"model": M, "prompt": _WHY}, {"model": M, "prompt": _WHY, "stream": False, "keep_alive": "5m"}))}),
    Route("/api/embed", Access.KEY, lambda d: Embed(d.gateway), {"post": inference(
        "Embeddings", EmbedRequest, "EmbedResponse", None, examples=({"model": M, "input": ["hello", "world"]},))}),
    Route("/api/embeddings", Access.KEY, lambda d: Embeddings(d.gateway), {"post": inference(
        "Embeddings (legacy)", EmbeddingsRequest, "EmbeddingsResponse", None,
        examples=({"model": M, "prompt": "hello"},))}),
)
