"""The OpenAI dialect: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings (/v1/responses, translated
to chat, is blazar/api/responses.py).

Thin resources: validate the fields Blazar acts on (the rest passes through to llama-server untouched: the engine
speaks this dialect), and let blazar/api/proxy.py run the call and send the engine's bytes back as they are: SSE
streams are relayed block by block without re-encoding a chunk. A forced tool choice and structured output are the
rewrites (the body, as the engine's grammar).
"""

from __future__ import annotations

from typing import Annotated, Any

import falcon
import falcon.asgi
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, WithJsonSchema, field_validator

from blazar.adapters.engines.kinds import engine_kind
from blazar.api.auth import Access, principal_of
from blazar.api.bounds import MAX_NAME_CHARS
from blazar.api.proxy import Proxy
from blazar.api.routes import Op, Route, inference
from blazar.api.schemas import SSE, ref
from blazar.context import Blazar
from blazar.dialects.schema import check_response_format, check_tools
from blazar.errors import DialectError, Refused
from blazar.events.requests import ReasoningEffort
from blazar.queries.catalog import StoredModel, model, models
from blazar.queries.remotes import remotes
from blazar.serving.request import Request
from blazar.store.chat_templates import capabilities
from blazar.store.model_settings import reranks


class OpenAIBody(BaseModel):
    # Unknown fields are the engine's business (sampling, tools, response_format, ...): passed on as sent.
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)
    stream: StrictBool = False


# The roles OpenAI's chat API defines; anything else would reach the engine's template as text.
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


_MESSAGES = {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"type": ["string", "array", "null"]}, "name": {"type": "string"}, "tool_calls": {"type": "array"},
    "tool_call_id": {"type": "string"}}}}
# What Blazar checks itself before the engine sees it (blazar/dialects/schema.py, whose messages name the part at
# fault), documented here; typed Any so that those checks, not the model, answer a bad one.
ResponseFormat = Annotated[Any, WithJsonSchema({
    "type": ["object", "null"], "required": ["type"], "description": "structured output (a schema is checked first)",
    "properties": {"type": {"enum": ["text", "json_object", "json_schema"]}, "json_schema": {"type": "object"}}})]
_TOOLS = Annotated[Any, WithJsonSchema({"type": ["array", "null"], "items": {
    "type": "object", "required": ["function"], "properties": {"type": {"const": "function"}, "function": {
        "type": "object", "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1},
                                                               "parameters": {"type": "object"}}}}}})]
_TOOL_CHOICE = Annotated[Any, WithJsonSchema({"oneOf": [
    {"enum": ["auto", "none", "required"]}, {"type": "object"}, {"type": "null"}],
    "description": "a forced call is enforced with the engine's grammar"})]


class ChatBody(OpenAIBody):
    messages: Annotated[list[dict[str, Any]], WithJsonSchema(_MESSAGES)] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    response_format: ResponseFormat = None
    tools: _TOOLS = None
    tool_choice: _TOOL_CHOICE = None
    # A budget of thinking tokens (blazar/serving/reasoning.py); llama-server also hands it to the template.
    reasoning_effort: ReasoningEffort | None = None
    thinking_budget_tokens: StrictInt | None = Field(None, ge=0, description="llama-server's own: the thinking's "
                                                     "budget in tokens (a model's own budget may lower it)")

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
    response_format: ResponseFormat = None


class EmbeddingBody(OpenAIBody):
    input: str | list[Any]


class ChatCompletions(Proxy):
    def ask(self, data: dict[str, Any]) -> Request:
        body = ChatBody.model_validate(data)
        check_response_format(data.get("response_format"))
        check_tools(data.get("tools"))
        # A forced tool choice and structured output are rewritten as the engine's grammar
        # (blazar/dialects/tools.py), so that body goes as a new one.
        forcing = data.get("tools") and data.get("tool_choice") not in (None, "auto", "none")
        rf = data.get("response_format")
        shaping = isinstance(rf, dict) and rf.get("type") in ("json_schema", "json_object")
        return Request(model=body.model, engine_path="/v1/chat/completions",
                       body=dict(data) if forcing or shaping else None,
                       stream=body.stream, max_tokens=body.max_completion_tokens or body.max_tokens)


class Completions(Proxy):
    def ask(self, data: dict[str, Any]) -> Request:
        body = CompletionBody.model_validate(data)
        check_response_format(data.get("response_format"))
        prompts = body.prompt if isinstance(body.prompt, list) else [body.prompt]
        if any(isinstance(p, dict) and "multimodal_data" in p for p in prompts):
            # NOTE: llama-server's own extension would take images past every check (bytes, bounds, projector).
            raise DialectError("prompt: multimodal_data is not accepted here; send images as image_url parts to "
                               "/v1/chat/completions")
        return Request(model=body.model, engine_path="/v1/completions", body=None, stream=body.stream,
                    max_tokens=body.max_tokens)


class Embeddings(Proxy):
    def ask(self, data: dict[str, Any]) -> Request:
        body = EmbeddingBody.model_validate(data)
        return Request(model=body.model, engine_path="/v1/embeddings", body=None, stream=False, embeddings=True)


def _model_json(m: StoredModel) -> dict[str, Any]:
    # Beside OpenAI's four fields: what the model can do, in the words of `blazar show` and Ollama's /api/show
    # ("completion", "chat", "embedding", "rerank", and "vision"/"audio" from its projector), as other gateways list
    # a model's abilities beside it; an OpenAI SDK keeps unknown fields (`model.capabilities`).
    # A whisper model or piper voice lists the routes its kind serves, as /api/show and `blazar show` do.
    # `kind` is Blazar's own too: what runs it (llama-server, whisper, piper), hence its routes.
    if m.gguf:
        caps = capabilities(m.metadata, m.projector.modalities if m.projector is not None else ())
        caps += ["rerank"] if reranks(m.metadata, m.settings) else []
    else:
        caps = sorted(engine_kind(m.kind).routes)
    return {"id": m.name, "object": "model", "created": int(m.added_ts), "owned_by": "blazar", "kind": m.kind,
            "capabilities": caps}


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


M = "gemma3-270m"  # the packaged demo model, in the document's examples
HELLO = [{"role": "user", "content": "Why is the sky blue?"}]
ROUTES = (
    # Inference and listings: the gateway and the listing handlers apply the key's scope.
    Route("/v1/models", Access.KEY, lambda d: Models(d.app), {"get": Op("The models in the store", ref("ModelList"))}),
    Route("/v1/models/{model_id}", Access.KEY, lambda d: Model(d.app), {"get": Op(
        "One model", ref("Model"), statuses=(404,))}),
    Route("/v1/chat/completions", Access.KEY, lambda d: ChatCompletions(d.gateway), {"post": inference(
        "Chat", ChatBody, "ChatCompletion", SSE, examples=(
            {"model": M, "messages": HELLO, "max_tokens": 32},
            {"model": M, "messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}))}),
    Route("/v1/completions", Access.KEY, lambda d: Completions(d.gateway), {"post": inference(
        "Text completion", CompletionBody, "Completion", SSE, examples=(
            {"model": M, "prompt": "Once upon a time", "max_tokens": 16},
            {"model": M, "prompt": "Once upon a time", "stream": True}))}),
    Route("/v1/embeddings", Access.KEY, lambda d: Embeddings(d.gateway), {"post": inference(
        "Embeddings", EmbeddingBody, "EmbeddingList", None, examples=({"model": M, "input": ["hello", "world"]},))}),
)
