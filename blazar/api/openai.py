"""The OpenAI dialect: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings (/v1/responses, translated
to chat, is blazar/api/responses.py).

Thin resources: validate the fields Blazar acts on (the rest passes through to llama-server untouched: the engine
speaks this dialect), and let blazar/api/proxy.py run the call and send the engine's bytes back as they are: SSE
streams are relayed block by block without re-encoding a chunk. A forced tool choice is the one rewrite.
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from blazar.api.auth import principal_of
from blazar.api.bounds import MAX_NAME_CHARS
from blazar.api.proxy import Proxy
from blazar.context import Blazar
from blazar.dialects.schema import check_response_format, check_tools
from blazar.errors import Refused
from blazar.queries.catalog import StoredModel, model, models
from blazar.queries.remotes import remotes
from blazar.serving.gateway import Gateway
from blazar.serving.request import Request


class OpenAIBody(BaseModel):
    # Unknown fields are the engine's business (sampling, tools, response_format, ...): passed on as sent.
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)
    stream: StrictBool = False


# The roles OpenAI's chat API defines; anything else would reach the engine's template as text.
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class ChatBody(OpenAIBody):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)

    @field_validator("messages")
    @classmethod
    def _roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, m in enumerate(messages):
            role = m.get("role")
            if not isinstance(role, str) or role not in ROLES:
                shown = repr(role)[:40]
                raise ValueError(f"messages[{i}].role: expected one of {', '.join(sorted(ROLES))}, got {shown}")
        return messages


class CompletionBody(OpenAIBody):
    prompt: str | list[Any]
    max_tokens: StrictInt | None = Field(None, ge=1)


class EmbeddingBody(OpenAIBody):
    input: str | list[Any]


class ResponsesBody(OpenAIBody):
    input: str | list[Any]
    max_output_tokens: StrictInt | None = Field(None, ge=1)


class ChatCompletions(Proxy):
    def ask(self, data: dict[str, Any]) -> Request:
        body = ChatBody.model_validate(data)
        check_response_format(data.get("response_format"))
        check_tools(data.get("tools"))
        # A forced tool choice is rewritten (blazar/dialects/tools.py), so that body goes as a new one.
        forcing = data.get("tools") and data.get("tool_choice") not in (None, "auto", "none")
        return Request(model=body.model, engine_path="/v1/chat/completions", body=dict(data) if forcing else None,
                    stream=body.stream, max_tokens=body.max_completion_tokens or body.max_tokens)


class Completions(Proxy):
    def ask(self, data: dict[str, Any]) -> Request:
        body = CompletionBody.model_validate(data)
        check_response_format(data.get("response_format"))
        return Request(model=body.model, engine_path="/v1/completions", body=None, stream=body.stream,
                    max_tokens=body.max_tokens)


class Embeddings(Proxy):
    def ask(self, data: dict[str, Any]) -> Request:
        body = EmbeddingBody.model_validate(data)
        return Request(model=body.model, engine_path="/v1/embeddings", body=None, stream=False, embeddings=True)


def _model_json(m: StoredModel) -> dict[str, Any]:
    # `kind` is Blazar's own beside OpenAI's fields: what runs it (llama-server, whisper, piper), hence its routes.
    return {"id": m.name, "object": "model", "created": int(m.added_ts), "owned_by": "blazar", "kind": m.kind}


class Models:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        p = principal_of(req)  # a key sees only the models in its scope
        local = [_model_json(m) for m in models(self.app) if p is None or p.allows(m.name)]
        served = [{"id": name, "object": "model", "created": int(r.added_ts), "owned_by": f"remote:{r.name}"}
                  for r in remotes(self.app) for name in r.models
                  if p is None or p.allows(name)]
        resp.media = {"object": "list", "data": local + served}


class Model:
    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model_id: str) -> None:
        m = model(self.app, model_id)
        p = principal_of(req)
        if m is None or (p is not None and not p.allows(model_id, m.name)):
            raise Refused(f"The model '{model_id}' does not exist", reason="model_not_found", http_status=404)
        resp.media = _model_json(m)


def add_routes(api: falcon.asgi.App, app: Blazar, gateway: Gateway) -> None:
    api.add_route("/v1/models", Models(app))
    api.add_route("/v1/models/{model_id}", Model(app))
    api.add_route("/v1/chat/completions", ChatCompletions(gateway))
    api.add_route("/v1/completions", Completions(gateway))
    api.add_route("/v1/embeddings", Embeddings(gateway))
