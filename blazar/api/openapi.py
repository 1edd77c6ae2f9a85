"""`GET /openapi.json`: an OpenAPI 3.1 document of every route the daemon serves, request bodies derived from the
resources' own pydantic models where they have one (so the document cannot drift from what is validated), the rest
and the answers written here. tests/unit/api/test_openapi.py walks the router to keep it true; tests/integration/
test_schemathesis.py fuzzes the daemon against it."""

from __future__ import annotations

import functools
import re
from typing import Any

import falcon
import falcon.asgi
from pydantic import BaseModel

import blazar
from blazar.api import (
    admin,
    anthropic,
    audio,
    auth,
    console,
    ollama,
    ollama_create,
    ollama_pull,
    openai,
    rerank,
    sessions,
)

JSON = "application/json"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
TEXT = "text/plain"
# The routes that stay open when keys are on (blazar/api/auth.py ROUTES): no secret in any.
OPEN_PATHS = tuple(route for route, rule in auth.ROUTES.items() if rule is auth.Access.OPEN)

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _model(model: type[BaseModel], **fields: Schema) -> Schema:
    """A pydantic model's own JSON schema, with `fields` narrowed where its type is wider than what it accepts
    (e.g. `list[dict]` messages): the names, requiredness and limits stay the model's."""
    schema = model.model_json_schema()
    schema.pop("title", None)
    for props in schema.get("properties", {}).values():
        props.pop("title", None)
    for name, sub in fields.items():
        assert name in schema["properties"], f"{model.__name__} has no field {name}"
        schema["properties"][name] = sub
    return schema


_INT = {"type": "integer"}
_STR = {"type": "string"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_OBJ = {"type": "object"}
_NULLABLE_STR = {"type": ["string", "null"]}
_NUMBER_RE = r"[0-9]+(\.[0-9]+)?"
_DURATION = {"oneOf": [{"type": ["number", "null"]},
                       {"type": "string", "pattern": rf"^[+-]?({_NUMBER_RE}|({_NUMBER_RE}(ns|us|µs|ms|s|m|h))+)$"}],
             "description": 'a duration ("5m", "1h30m", "300"), seconds, or negative for forever'}

# -- request bodies written by hand: the dialects' own checks (blazar/dialects/) have no pydantic model ------------

_OPENAI_MESSAGE: Schema = {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"type": ["string", "array", "null"]}, "name": _STR, "tool_calls": {"type": "array"},
    "tool_call_id": _STR}}

_ANTHROPIC_BLOCK: Schema = {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string", "enum": ["text", "image", "tool_use", "tool_result", "thinking"]}}}
_ANTHROPIC_MESSAGES: Schema = {"type": "object", "required": ["model", "max_tokens", "messages"], "properties": {
    "model": {"type": "string", "minLength": 1},
    "max_tokens": {"type": "integer", "minimum": 1},
    "messages": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["role", "content"],
                 "properties": {"role": {"type": "string", "enum": ["user", "assistant", "system"]},
                                "content": {"oneOf": [_STR, {"type": "array", "items": _ANTHROPIC_BLOCK}]}}}},
    "system": {"oneOf": [_STR, {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                                 "properties": {"type": {"const": "text"}, "text": _STR}}}]},
    "stream": {"type": ["boolean", "null"]},
    "temperature": {"type": ["number", "null"]}, "top_p": {"type": ["number", "null"]},
    "top_k": {"type": ["integer", "null"]},
    "stop_sequences": {"type": ["array", "null"], "items": _STR},
    "tools": {"type": ["array", "null"], "items": {"type": "object", "required": ["name", "input_schema"],
              "properties": {"name": _STR, "description": _STR, "input_schema": _OBJ}}},
    "tool_choice": {"type": ["object", "null"], "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]}, "name": _STR,
        "disable_parallel_tool_use": _BOOL}},
    "output_config": {"type": ["object", "null"]},
    "metadata": {}, "service_tier": {}, "thinking": {}, "container": {}, "mcp_servers": {}}}

_OLLAMA_OPTIONS: Schema = {"type": ["object", "null"], "description": "sampling options (an unknown one is a 400)",
                           "properties": {"temperature": _NUM, "top_p": _NUM, "min_p": _NUM, "top_k": _INT,
                                          "seed": _INT, "num_predict": {"type": "integer", "minimum": -2},
                                          "num_ctx": {"type": "integer", "minimum": 1, "maximum": 1 << 24},
                                          "stop": {"oneOf": [_STR, {"type": "array", "items": _STR}]}},
                           "additionalProperties": False}
_OLLAMA_COMMON: Schema = {"model": {"type": "string", "minLength": 1}, "stream": {"type": ["boolean", "null"]},
                          "options": _OLLAMA_OPTIONS, "keep_alive": _DURATION,
                          "format": {"oneOf": [{"enum": ["", "json"]}, _OBJ, {"type": "null"}]},
                          "think": {"oneOf": [{"type": ["boolean", "null"]},
                                              {"enum": ["low", "medium", "high", "max"]}]},
                          "logprobs": {"type": ["boolean", "null"], "description": "refused with raw"},
                          "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20}}
_OLLAMA_CHAT: Schema = {"type": "object", "required": ["model"], "properties": {
    **_OLLAMA_COMMON,
    "messages": {"type": ["array", "null"], "items": {"type": "object", "required": ["role"], "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]}, "content": _STR,
        "images": {"type": "array", "items": _STR}, "tool_calls": {"type": "array"}, "tool_name": _STR}}},
    "tools": {"type": ["array", "null"], "items": {"type": "object", "required": ["type", "function"],
              "properties": {"type": {"const": "function"}, "function": _OBJ}}}}}
_OLLAMA_GENERATE: Schema = {"type": "object", "required": ["model"], "properties": {
    **_OLLAMA_COMMON, "prompt": _NULLABLE_STR, "system": _NULLABLE_STR, "raw": {"type": ["boolean", "null"]},
    "images": {"type": ["array", "null"], "items": _STR},
    "template": {"type": ["string", "null"], "description": "refused unless empty"},
    "suffix": {"type": ["string", "null"], "description": "refused unless empty"},
    "context": {"type": ["array", "null"], "maxItems": 0, "description": "refused unless empty"}}}
_OLLAMA_EMBED: Schema = {"type": "object", "required": ["model"], "properties": {
    "model": {"type": "string", "minLength": 1},
    "input": {"oneOf": [_STR, {"type": "array", "items": _STR}, {"type": "null"}]},
    "truncate": _BOOL, "dimensions": {"type": ["integer", "null"], "minimum": 1}, "options": _OLLAMA_OPTIONS,
    "keep_alive": _DURATION}}
_OLLAMA_EMBEDDINGS: Schema = {"type": "object", "required": ["model"], "properties": {
    "model": {"type": "string", "minLength": 1}, "prompt": _NULLABLE_STR, "options": _OLLAMA_OPTIONS,
    "keep_alive": _DURATION}}

# -- answers ----------------------------------------------------------------------------------------------------

_USAGE = {"type": "object", "properties": {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT}}
_OLLAMA_DETAILS = {"type": "object", "properties": {
    "parent_model": _STR, "format": _STR, "family": _STR, "families": {"type": ["array", "null"], "items": _STR},
    "parameter_size": _STR, "quantization_level": _STR}}
_OLLAMA_STATS = {k: _INT for k in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
                                   "eval_count", "eval_duration")}
_TOKEN_FIELDS: Schema = {"token": _STR, "logprob": _NUM, "bytes": {"type": "array", "items": _INT}}
_TOKEN_LOGPROB: Schema = {"type": "object", "required": ["token", "logprob"], "properties": _TOKEN_FIELDS}
_OLLAMA_LOGPROBS: Schema = {"type": "array", "items": {"type": "object", "required": ["token", "logprob"],
                                                       "properties": {**_TOKEN_FIELDS, "top_logprobs": {
                                                           "type": "array", "items": _TOKEN_LOGPROB}}}}

SCHEMAS: dict[str, Schema] = {
    # The three error shapes (blazar/api/errors.py renders each by route).
    "OpenAIError": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type"], "properties": {
            # The engine's own refusals are passed on as it wrote them: llama-server's code is the HTTP status.
            "message": _STR, "type": _STR, "code": {"type": ["string", "integer", "null"]},
            "param": _NULLABLE_STR}}}},
    "AnthropicError": {"type": "object", "required": ["type", "error"], "properties": {
        "type": {"const": "error"},
        "error": {"type": "object", "required": ["type", "message"], "properties": {"type": _STR,
                                                                                       "message": _STR}}}},
    "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": _STR}},
    # Admin (/api/blazar/).
    "LoadBody": _model(admin.LoadBody, keep_alive=_DURATION),
    "AdminModelBody": _model(admin.ModelBody),
    "VerifyBody": _model(console.VerifyBody),
    "SessionRestoreBody": _model(sessions.RestoreBody),
    "Instance": {"type": "object", "required": ["instance_id", "model", "slots", "ctx_tokens", "engine_tag"],
                 "properties": {"instance_id": _STR, "model": _STR, "port": {"type": ["integer", "null"]},
                                "slots": _INT, "ctx_tokens": _INT, "engine_tag": _STR,
                                "load_ms": {"type": ["integer", "null"]}, "embeddings": _BOOL}},
    "Ps": {"type": "object", "required": ["instances", "circuits"], "properties": {
        "instances": {"type": "array", "items": _OBJ},
        "circuits": {"type": "object", "additionalProperties": _NUM, "description": "model → open until (unix s)"}}},
    # OpenAI.
    "ChatBody": _model(openai.ChatBody, messages={"type": "array", "minItems": 1, "items": _OPENAI_MESSAGE}),
    "CompletionBody": _model(openai.CompletionBody),
    "EmbeddingBody": _model(openai.EmbeddingBody),
    "RerankBody": _model(rerank.RerankBody),
    "SpeechBody": _model(audio.SpeechBody),
    "RerankList": {"type": "object", "required": ["model", "results", "usage"], "properties": {
        "model": _STR, "object": _STR, "usage": _USAGE, "results": {"type": "array", "items": {
            "type": "object", "required": ["index", "relevance_score"], "properties": {
                "index": _INT, "relevance_score": _NUM, "document": {
                    "type": "object", "required": ["text"], "properties": {"text": _STR}}}}}}},
    "ResponsesBody": _model(openai.ResponsesBody),
    "Model": {"type": "object", "required": ["id", "object", "created", "owned_by"], "properties": {
        "id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR, "kind": _STR,
        "capabilities": {"type": "array", "items": _STR}}},
    "ModelList": {"type": "object", "required": ["object", "data"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}}},
    "ChatCompletion": {"type": "object", "required": ["choices"], "properties": {
        "id": _STR, "object": _STR, "created": _INT, "model": _STR, "usage": _USAGE,
        "choices": {"type": "array", "items": {"type": "object", "properties": {
            "index": _INT, "message": _OBJ, "finish_reason": _NULLABLE_STR}}}}},
    "Completion": {"type": "object", "required": ["choices"], "properties": {
        "id": _STR, "object": _STR, "created": _INT, "model": _STR, "usage": _USAGE,
        "choices": {"type": "array", "items": {"type": "object", "properties": {
            "index": _INT, "text": _STR, "finish_reason": _NULLABLE_STR}}}}},
    "EmbeddingList": {"type": "object", "required": ["data"], "properties": {
        "object": _STR, "model": _STR, "usage": _USAGE, "data": {"type": "array", "items": {
            "type": "object", "required": ["embedding"], "properties": {
                "index": _INT, "object": _STR, "embedding": {"type": ["array", "string"], "items": _NUM}}}}}},
    "Response": {"type": "object", "description": "a Response: output items (message, function_call) and usage",
                 "required": ["id", "object", "output"], "properties": {
                     "id": _STR, "object": {"const": "response"}, "status": _STR, "model": _STR,
                     "output": {"type": "array", "items": _OBJ}, "usage": {"type": ["object", "null"]}}},
    # Anthropic.
    "MessagesBody": _ANTHROPIC_MESSAGES,
    "CountTokensBody": _model(anthropic.CountBody, messages=_ANTHROPIC_MESSAGES["properties"]["messages"]),
    "Message": {"type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
                "properties": {
                    "id": _STR, "type": {"const": "message"}, "role": {"const": "assistant"}, "model": _STR,
                    "content": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
                        "type": {"enum": ["text", "thinking", "tool_use"]}, "text": _STR, "thinking": _STR,
                        "id": _STR, "name": _STR, "input": _OBJ}}},
                    "stop_reason": _NULLABLE_STR, "stop_sequence": _NULLABLE_STR,
                    "usage": {"type": "object", "required": ["input_tokens", "output_tokens"], "properties": {
                        k: _INT for k in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                                          "cache_creation_input_tokens")}}}},
    "TokenCount": {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": _INT}},
    # Ollama.
    "OllamaModelBody": _model(ollama.ModelBody),
    "CopyBody": _model(ollama.CopyBody),
    "PullBody": _model(ollama_pull.PullBody),
    "CreateBody": _model(ollama_create.CreateBody),
    "ChatRequest": _OLLAMA_CHAT,
    "GenerateRequest": _OLLAMA_GENERATE,
    "EmbedRequest": _OLLAMA_EMBED,
    "EmbeddingsRequest": _OLLAMA_EMBEDDINGS,
    "Tags": {"type": "object", "required": ["models"], "properties": {"models": {"type": "array", "items": {
        "type": "object", "required": ["name", "model", "modified_at", "size", "digest", "details"], "properties": {
            "name": _STR, "model": _STR, "modified_at": _STR, "size": _INT, "digest": _STR,
            "details": _OLLAMA_DETAILS}}}}},
    "OllamaPs": {"type": "object", "required": ["models"], "properties": {"models": {"type": "array", "items": {
        "type": "object", "required": ["name", "model", "size", "expires_at"], "properties": {
            "name": _STR, "model": _STR, "size": _INT, "digest": _STR, "details": _OLLAMA_DETAILS,
            "expires_at": _STR, "size_vram": _INT, "context_length": {"type": ["integer", "null"]}}}}}},
    "Show": {"type": "object", "required": ["details", "model_info", "capabilities"], "properties": {
        "modelfile": _STR, "parameters": _STR, "template": _STR, "system": _STR, "details": _OLLAMA_DETAILS,
        "model_info": _OBJ, "capabilities": {"type": "array", "items": _STR}, "modified_at": _STR,
        "blazar": {"type": "object", "properties": {"completion_only": _BOOL, "template_source": {
            "enum": ["settings", "gguf", "probe", "architecture", "fallback"]}, "template": _STR}}}},
    "ChatResponse": {"type": "object", "required": ["model", "created_at", "message", "done"], "properties": {
        "model": _STR, "created_at": _STR, "done": _BOOL, "done_reason": _STR, **_OLLAMA_STATS,
        "message": {"type": "object", "required": ["role", "content"], "properties": {
            "role": _STR, "content": _STR, "thinking": _STR, "tool_calls": {"type": "array"}}},
        "logprobs": _OLLAMA_LOGPROBS}},
    "GenerateResponse": {"type": "object", "required": ["model", "created_at", "response", "done"], "properties": {
        "model": _STR, "created_at": _STR, "response": _STR, "thinking": _STR, "done": _BOOL, "done_reason": _STR,
        "logprobs": _OLLAMA_LOGPROBS, **_OLLAMA_STATS}},
    "EmbedResponse": {"type": "object", "required": ["model", "embeddings"], "properties": {
        "model": _STR, "embeddings": {"type": "array", "items": {"type": "array", "items": _NUM}},
        "total_duration": _INT, "load_duration": _INT, "prompt_eval_count": _INT}},
    "EmbeddingsResponse": {"type": "object", "required": ["embedding"], "properties": {
        "embedding": {"type": "array", "items": _NUM}}},
    "PullStatus": {"type": "object", "required": ["status"], "properties": {"status": {"const": "success"}}},
    "PullLine": {"oneOf": [
        {"type": "object", "required": ["status"], "properties": {"status": _STR, "digest": _STR, "total": _INT,
                                                                   "completed": _INT}},
        _ref("OllamaError")]},
}

# -- operations -------------------------------------------------------------------------------------------------

_PHRASES = {400: "the request is not valid (bad JSON, a field that does not validate)",
            401: "an API key is required (auth is on once a key exists)",
            403: "refused: the key's scope, a Host or Origin not allowed, or the hub's access",
            404: "no such model (or not loaded, or not on the hub)", 405: "method not allowed",
            408: "the body did not arrive in time (body_idle_timeout_s, body_timeout_s); the connection is closed",
            409: "the name is taken, the model is in use, or pinned in another shape",
            413: "the body is over max_body_mib",
            415: "the body is not JSON", 429: "a limit: the queue is full, or the key's rate (Retry-After)",
            502: "the engine (or the hub) failed",
            503: "no engine, an open circuit, the queue timed out, or too many bodies arriving "
                 "(server.max_incoming_bodies)",
            507: "the model does not fit in memory"}
_ERROR_SCHEMA = {"openai": "OpenAIError", "anthropic": "AnthropicError", "ollama": "OllamaError"}

# The statuses every route may answer besides its own (auth and the edge guards answer before the route runs).
_EDGE = (401, 403, 429)  # a key missing, out of scope, or over its limits
_BODY = (400, 408, 413, 415, 503)  # 408 and 503: blazar/api/incoming.py, before the route reads the body
_ENGINE = (404, 409, 429, 502, 503, 507)  # resolve, load (a pin in the way), admit, run


def _dialect(path: str) -> str:
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "ollama" if path.startswith("/api/") and not path.startswith("/api/blazar/") else "openai"


# One server-sent event as schemathesis and clients read it; its data is the engine's (or the dialect's) chunk.
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"event": _STR, "data": _STR, "id": _STR}}


def _content(*types: str, schema: Schema | None = None, line: Schema | None = None) -> dict[str, Any]:
    """JSON answers take `schema`; an NDJSON stream's schema is that of each line (`line`, else `schema` or an
    error line); SSE, each event's."""
    out: dict[str, Any] = {}
    for t in types:
        if t == JSON:
            out[t] = {"schema": schema or _OBJ}
        elif t == NDJSON:
            out[t] = {"schema": {"description": "one JSON object a line",
                                 **(line or {"oneOf": [schema or _OBJ, _ref("OllamaError")]})}}
        elif t == SSE:
            out[t] = {"schema": _SSE_EVENT}
        elif t.startswith("audio/"):
            out[t] = {"schema": {"type": "string", "format": "binary"}}
        else:
            out[t] = {"schema": _STR}
    return out


# Request examples by body schema: what a client sends (the model's name is the packaged demo model's).
_M = "gemma3-270m"
_HELLO = [{"role": "user", "content": "Why is the sky blue?"}]
EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "LoadBody": [{"model": _M, "keep_alive": "10m", "pin": False}],
    "AdminModelBody": [{"model": _M}],
    "ChatBody": [{"model": _M, "messages": _HELLO, "max_tokens": 32},
                 {"model": _M, "messages": _HELLO, "stream": True, "stream_options": {"include_usage": True}}],
    "CompletionBody": [{"model": _M, "prompt": "Once upon a time", "max_tokens": 16},
                       {"model": _M, "prompt": "Once upon a time", "stream": True}],
    "EmbeddingBody": [{"model": _M, "input": ["hello", "world"]}],
    "RerankBody": [{"model": _M, "query": "What is a panda?", "documents": ["hi", "The giant panda is a bear."],
                    "top_n": 1}],
    "ResponsesBody": [{"model": _M, "input": "Why is the sky blue?"}],
    "MessagesBody": [{"model": _M, "max_tokens": 64, "messages": _HELLO},
                     {"model": _M, "max_tokens": 64, "messages": _HELLO, "stream": True, "system": "Be brief."}],
    "CountTokensBody": [{"model": _M, "messages": _HELLO}],
    "OllamaModelBody": [{"model": _M}],
    "CopyBody": [{"source": _M, "destination": "gemma"}],
    "PullBody": [{"model": "ggml-org/gemma-3-270m-GGUF", "stream": False}],
    "CreateBody": [{"model": "brief", "from": _M, "system": "Answer in one sentence.",
                    "parameters": {"temperature": 0.2}, "stream": False},
                   {"model": "brief", "modelfile": f"FROM {_M}\nPARAMETER temperature 0.2\n", "stream": False}],
    "ChatRequest": [{"model": _M, "messages": _HELLO}, {"model": _M, "messages": _HELLO, "stream": False,
                                                       "options": {"num_predict": 16}}],
    "GenerateRequest": [{"model": _M, "prompt": "Why is the sky blue?"},
                        {"model": _M, "prompt": "Why is the sky blue?", "stream": False, "keep_alive": "5m"}],
    "EmbedRequest": [{"model": _M, "input": ["hello", "world"]}],
    "EmbeddingsRequest": [{"model": _M, "prompt": "hello"}],
}


def _op(path: str, summary: str, ok: Schema | None, *, statuses: tuple[int, ...] = (), body: str | None = None,
        ok_types: tuple[str, ...] = (JSON,), engine_errors: bool = False, line: Schema | None = None
        ) -> dict[str, Any]:
    """One operation: its 200 (JSON `ok`, or a stream, or text), its errors in the route's dialect."""
    error = _ref(_ERROR_SCHEMA[_dialect(path)])
    responses: dict[str, Any] = {"200": {"description": "OK", "content": _content(*ok_types, schema=ok, line=line)}
                                 if ok is not None or ok_types != (JSON,) else {"description": "OK"}}
    codes = set(statuses) | set(_EDGE) | (set(_BODY) if body else set())
    for code in sorted(codes):
        responses[str(code)] = {"description": _PHRASES[code], "content": {JSON: {"schema": error}}}
    if engine_errors:
        # NOTE: the engine's own refusals (a sampling value it rejects) keep its status, in the caller's shape.
        responses["4XX"] = {"description": "the engine refused the request", "content": {JSON: {"schema": error}}}
    op: dict[str, Any] = {"summary": summary, "tags": [_dialect(path) if path.startswith(("/v1", "/api/")) and not
                                                       path.startswith("/api/blazar/") else "blazar"],
                          "responses": responses}
    if body is not None:
        media: dict[str, Any] = {"schema": _ref(body)}
        if body in EXAMPLES:
            media["examples"] = {f"example{i}": {"value": v} for i, v in enumerate(EXAMPLES[body], 1)}
        op["requestBody"] = {"required": True, "content": {JSON: media}}
    if path in OPEN_PATHS:
        op["security"] = []
        for code in _EDGE:
            responses.pop(str(code), None)
        responses["403"] = {"description": "a Host not allowed", "content": {JSON: {"schema": error}}}
    return op


def _infer(path: str, summary: str, body: str, ok: str, stream: str | None) -> dict[str, Any]:
    types = (JSON, stream) if stream else (JSON,)
    return _op(path, summary, _ref(ok), statuses=_ENGINE, body=body, ok_types=types, engine_errors=True)


def _ready() -> dict[str, Any]:
    op = _op("/ready", "Can the gateway admit, load and generate now (a smoke generation)", {
        "type": "object", "required": ["status", "checks"], "properties": {"status": {"const": "ready"},
                                                                         "checks": _OBJ}})
    op["responses"]["503"] = {"description": "not ready: the failing check says why", "content": {JSON: {"schema": {
        "type": "object", "required": ["status", "checks"], "properties": {"status": {"const": "not_ready"},
                                                                         "checks": _OBJ}}}}}
    return op


def _query(name: str, schema: Schema, description: str) -> dict[str, Any]:
    param: dict[str, Any] = {"name": name, "in": "query", "required": False, "schema": schema,
                             "description": description}
    if schema.get("type") == "array":
        param |= {"style": "form", "explode": True}
    return param


_EVENT_FILTERS = [_query("type", {"type": "array", "items": _STR, "maxItems": 32}, "event types (repeat, or a,b)"),
                  _query("stream", {"type": "string", "maxLength": 256}, "one stream, e.g. model:gemma3-270m"),
                  _query("trace", {"type": "string", "maxLength": 64}, "one trace id")]


def _console() -> dict[str, dict[str, dict[str, Any]]]:
    """The web console (blazar/api/console.py): its page and files, and the read routes it calls."""
    events = _op("/api/blazar/events", "The newest events matching the filters, oldest first", {
        "type": "object", "required": ["events", "last_seq"], "properties": {
            "events": {"type": "array", "items": _OBJ}, "last_seq": _INT}}, statuses=(400,))
    seq = {"type": "integer", "minimum": 0, "maximum": 2**62}
    events["parameters"] = [*_EVENT_FILTERS, _query("before", seq, "seq at most"),
                            _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "at most (200)")]
    follow = _op("/api/blazar/events/follow", "The event log live (server-sent events; ends after timeout_s)", None,
                 statuses=(400, 503), ok_types=(SSE,))
    follow["parameters"] = [*_EVENT_FILTERS,
                            _query("after", seq, "resume after this seq (the last)"),
                            _query("timeout_s", {"type": "number", "exclusiveMinimum": 0, "maximum": 600},
                                   "end the stream after this long (300)")]
    static = _op("/console/static/{name}", "A file of the console page", None, statuses=(404,),
                 ok_types=("text/css", "text/javascript", "image/png"))
    why = _op("/api/blazar/why/{trace}", "One request's story (blazar why --json); `last`: the last failed", {
        "type": "object", "required": ["trace_id", "verdict", "steps"], "properties": {
            "trace_id": _STR, "verdict": _STR, "steps": {"type": "array", "items": _OBJ}}}, statuses=(404,))
    return {
        "/console": {"get": _op("/console", "The web console", None, ok_types=("text/html",))},
        "/console/static/{name}": {"get": static},
        "/api/blazar/events": {"get": events},
        "/api/blazar/events/follow": {"get": follow},
        "/api/blazar/why/{trace}": {"get": why},
        "/api/blazar/models": {"get": _op("/api/blazar/models", "The model store, each model's fit here now", {
            "type": "object", "required": ["models", "aliases"], "properties": {
                "models": {"type": "array", "items": _OBJ}, "aliases": _OBJ}})},
        "/api/blazar/engines": {"get": _op("/api/blazar/engines", "The engines with their verify and smoke results", {
            "type": "object", "required": ["active", "engines"], "properties": {
                "active": _NULLABLE_STR, "engines": {"type": "array", "items": _OBJ}}})},
        "/api/blazar/engines/verify": {"post": _op("/api/blazar/engines/verify", "Hash an engine's files (default: "
                                                   "the active one) against its install record", {
            "type": "object", "required": ["tag", "ok", "problems"], "properties": {
                "tag": _STR, "ok": _BOOL, "problems": {"type": "array", "items": _STR}}},
            statuses=(404, 503), body="VerifyBody")},
        "/api/blazar/nodes": {"get": _op("/api/blazar/nodes", "The gateways sharing this log, and where each model "
                                         "is (loaded, and in whose store)", {
            "type": "object", "required": ["this_node", "nodes"], "properties": {
                "this_node": _NULLABLE_STR, "nodes": {"type": "array", "items": _OBJ}}})},
    }


def _sessions() -> dict[str, dict[str, dict[str, Any]]]:
    """The KV bank's sessions (blazar/api/sessions.py)."""
    restore = _op("/api/blazar/sessions/{name}/restore", "Restore a session's newest save into a free slot", {
        "type": "object", "required": ["session", "model", "kv"], "properties": {
            "session": _STR, "model": _STR, "instance_id": _STR, "slot_id": _INT, "kv": _STR}},
        statuses=(400, 404, 409, 502, 503, 507))
    restore["requestBody"] = {"required": False, "content": {JSON: {"schema": _ref("SessionRestoreBody")}}}
    return {
        "/api/blazar/sessions": {"get": _op("/api/blazar/sessions", "Every session and the KV bank's size", {
            "type": "object", "required": ["sessions", "bank_bytes"], "properties": {
                "sessions": {"type": "array", "items": _OBJ}, "bank_bytes": _INT, "bank_limit_bytes": _INT}})},
        "/api/blazar/sessions/{name}": {
            "get": _op("/api/blazar/sessions/{name}", "One session and its saves", _OBJ, statuses=(400, 404)),
            "delete": _op("/api/blazar/sessions/{name}", "Forget a session and delete its saves", _OBJ,
                          statuses=(400, 404))},
        "/api/blazar/sessions/{name}/save": {"post": _op(
            "/api/blazar/sessions/{name}/save", "Save a session's live slot to the KV bank now", {
                "type": "object", "required": ["events"], "properties": {"events": {"type": "array", "items": _OBJ}}},
            statuses=(400, 404, 409))},
        "/api/blazar/sessions/{name}/restore": {"post": restore},
    }


def _audio() -> dict[str, dict[str, dict[str, Any]]]:
    """OpenAI's audio routes (blazar/api/audio.py): uploads as multipart forms, speech as audio bytes."""
    form = {"type": "object", "required": ["file", "model"], "properties": {
        "file": {"type": "string", "format": "binary"}, "model": _STR, "language": _STR, "prompt": _STR,
        "response_format": {"enum": list(audio.TRANSCRIPTION_FORMATS)}, "temperature": _NUM,
        "timestamp_granularities[]": {"type": "array", "items": {"enum": ["word", "segment"]}},
        "stream": _BOOL}}
    text = {"type": "object", "required": ["text"], "properties": {"text": _STR}}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for route, summary in (("transcriptions", "Speech to text (a whisper model)"),
                           ("translations", "Speech to English text (a whisper model)")):
        path = f"/v1/audio/{route}"
        op = _op(path, summary, text, statuses=(*_ENGINE, 413), ok_types=(JSON, TEXT, SSE), engine_errors=True)
        op["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": form}}}
        out[path] = {"post": op}
    speech = _op("/v1/audio/speech", "Text to speech (a piper voice), streamed as it is made", None,
                 statuses=_ENGINE, body="SpeechBody", engine_errors=True,
                 ok_types=("audio/mpeg", "audio/opus", "audio/aac", "audio/flac", "audio/wav", "audio/pcm"))
    out["/v1/audio/speech"] = {"post": speech}
    out["/v1/audio/voices"] = {"get": _op("/v1/audio/voices", "The piper voices in the store and their speakers", {
        "type": "object", "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _OBJ}}})}
    return out


def _files_batches() -> dict[str, dict[str, dict[str, Any]]]:
    """OpenAI's files and batches (blazar/api/files.py, blazar/api/batches.py): each key's own."""
    file_obj = {"type": "object", "required": ["id", "object", "bytes", "filename", "purpose"], "properties": {
        "id": _STR, "object": {"const": "file"}, "bytes": _INT, "created_at": _INT, "filename": _STR,
        "purpose": _STR}}
    batch = {"type": "object", "required": ["id", "object", "status", "endpoint", "input_file_id"], "properties": {
        "id": _STR, "object": {"const": "batch"}, "status": _STR, "endpoint": _STR, "input_file_id": _STR,
        "request_counts": _OBJ}}
    listed = {"type": "object", "required": ["object", "data"], "properties": {"object": {"const": "list"},
                                                                               "data": {"type": "array"}}}
    upload = _op("/v1/files", "Upload a file (multipart: file, purpose)", file_obj, statuses=(400, 413))
    upload["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file", "purpose"], "properties": {
            "file": {"type": "string", "format": "binary"}, "purpose": {"enum": ["batch", "user_data"]}}}}}}
    create = _op("/v1/batches", "Create a batch from an uploaded file", batch, statuses=(400, 404))
    create["requestBody"] = {"required": True, "content": {JSON: {"schema": {
        "type": "object", "required": ["input_file_id", "endpoint", "completion_window"], "properties": {
            "input_file_id": _STR, "endpoint": _STR, "completion_window": _STR, "metadata": _OBJ}}}}}
    return {
        "/v1/files": {"post": upload, "get": _op("/v1/files", "The caller's files", listed, statuses=(400,))},
        "/v1/files/{file_id}": {"get": _op("/v1/files/{file_id}", "One file", file_obj, statuses=(404,)),
                                "delete": _op("/v1/files/{file_id}", "Delete a file", _OBJ, statuses=(404,))},
        "/v1/files/{file_id}/content": {"get": _op("/v1/files/{file_id}/content", "A file's content", None,
                                                   statuses=(404,), ok_types=("application/octet-stream",))},
        "/v1/batches": {"post": create, "get": _op("/v1/batches", "The caller's batches, newest first", listed,
                                                   statuses=(400,))},
        "/v1/batches/{batch_id}": {"get": _op("/v1/batches/{batch_id}", "One batch", batch, statuses=(404,))},
        "/v1/batches/{batch_id}/cancel": {"post": _op("/v1/batches/{batch_id}/cancel", "Cancel a batch", batch,
                                                      statuses=(404, 409))},
    }


def _operations() -> dict[str, dict[str, dict[str, Any]]]:
    p: dict[str, dict[str, dict[str, Any]]] = {
        "/health": {"get": _op("/health", "The listener is up", {"type": "object", "required": ["status"],
                                                                  "properties": {"status": {"const": "ok"}}})},
        "/openapi.json": {"get": _op("/openapi.json", "This document", _OBJ)},
        "/ready": {"get": _ready()},
        "/metrics": {"get": _op("/metrics", "Prometheus text", None, ok_types=(TEXT,))},
        # Admin.
        "/api/blazar/ps": {"get": _op("/api/blazar/ps", "Running instances and open circuits", _ref("Ps"))},
        "/api/blazar/dashboard": {"get": _op("/api/blazar/dashboard", "What `blazar watch` shows (its shape: "
                                             "blazar/queries/dashboard.py)", {
            "type": "object", "required": ["version", "at", "seq", "instances", "queues", "tokens_per_s", "requests",
                                           "failures"],
            "properties": {"version": _INT, "seq": _INT, "instances": {"type": "array", "items": _OBJ},
                           "requests": {"type": "array", "items": _OBJ}, "failures": {"type": "array", "items": _OBJ},
                           "queues": _OBJ, "tokens_per_s": _OBJ}})},
        "/api/blazar/queue": {"get": _op("/api/blazar/queue", "Admission per model", {
            "type": "object", "required": ["queues"], "properties": {"queues": _OBJ}})},
        "/api/blazar/load": {"post": _op("/api/blazar/load", "Load a model (or change a loaded one's keep_alive/pin)",
                                         _ref("Instance"), statuses=_ENGINE, body="LoadBody")},
        "/api/blazar/stop": {"post": _op("/api/blazar/stop", "Stop a model's instances", {
            "type": "object", "required": ["stopped"], "properties": {"stopped": {"type": "array", "items": _STR}}},
            statuses=(404,), body="AdminModelBody")},
        "/api/blazar/reset": {"post": _op("/api/blazar/reset", "Close a model's crash circuit", {
            "type": "object", "required": ["reset"], "properties": {"reset": _BOOL}},
            statuses=(404,), body="AdminModelBody")},
        "/api/blazar/sync": {"post": _op("/api/blazar/sync", "Fold what other processes appended (a key change), now", {
            "type": "object", "required": ["seq"], "properties": {"seq": _INT}})},
        **_console(),
        **_sessions(),
        # OpenAI.
        "/v1/models": {"get": _op("/v1/models", "The models in the store", _ref("ModelList"))},
        "/v1/models/{model_id}": {"get": _op("/v1/models/{model_id}", "One model", _ref("Model"), statuses=(404,))},
        "/v1/chat/completions": {"post": _infer("/v1/chat/completions", "Chat", "ChatBody", "ChatCompletion", SSE)},
        "/v1/completions": {"post": _infer("/v1/completions", "Text completion", "CompletionBody", "Completion",
                                           SSE)},
        "/v1/embeddings": {"post": _infer("/v1/embeddings", "Embeddings", "EmbeddingBody", "EmbeddingList", None)},
        "/v1/rerank": {"post": _infer("/v1/rerank", "Rerank documents by relevance to a query (Jina/Cohere)",
                                      "RerankBody", "RerankList", None)},
        "/rerank": {"post": _infer("/rerank", "Rerank (the same as /v1/rerank)", "RerankBody", "RerankList", None)},
        "/v1/responses": {"post": _infer("/v1/responses", "Responses", "ResponsesBody", "Response", SSE)},
        "/v1/responses/{response_id}": {
            "get": _op("/v1/responses/{response_id}", "A stored response (the caller's own)", _ref("Response"),
                       statuses=(404,)),
            "delete": _op("/v1/responses/{response_id}", "Delete a stored response and its content", {
                "type": "object", "required": ["id", "object", "deleted"],
                "properties": {"id": _STR, "object": {"const": "response"}, "deleted": _BOOL}}, statuses=(404,))},
        "/v1/responses/{response_id}/input_items": {"get": _op(
            "/v1/responses/{response_id}/input_items", "The input items a stored response was given", {
                "type": "object", "required": ["object", "data", "has_more"],
                "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _OBJ},
                               "first_id": {"type": ["string", "null"]}, "last_id": {"type": ["string", "null"]},
                               "has_more": _BOOL}}, statuses=(400, 404))},
        **_files_batches(),
        **_audio(),
        # Anthropic.
        "/v1/messages": {"post": _infer("/v1/messages", "Messages", "MessagesBody", "Message", SSE)},
        "/v1/messages/count_tokens": {"post": _op("/v1/messages/count_tokens", "Count a prompt's tokens",
                                                  _ref("TokenCount"), statuses=_ENGINE, body="CountTokensBody")},
        # Ollama.
        "/": {"get": _op("/", "Ollama's liveness answer", None, ok_types=(TEXT,)),
              "head": _op("/", "Ollama's liveness answer, head only", None)},
        "/api/version": {"get": _op(
            "/api/version", "The Ollama API version Blazar answers as (its own is in x-blazar-version)",
            {"type": "object", "required": ["version"],
             "properties": {"version": {"const": ollama.OLLAMA_API_VERSION}}})},
        "/api/tags": {"get": _op("/api/tags", "The models in the store", _ref("Tags")),
                      "head": _op("/api/tags", "The models in the store, head only", None)},
        "/api/ps": {"get": _op("/api/ps", "The loaded models", _ref("OllamaPs"))},
        "/api/show": {"post": _op("/api/show", "One model's details", _ref("Show"), statuses=(404,),
                                  body="OllamaModelBody")},
        "/api/copy": {"post": _op("/api/copy", "A new name (an alias) for a model", None, statuses=(404, 409),
                                  body="CopyBody")},
        "/api/delete": {"delete": _op("/api/delete", "Remove a model, or an alias", None, statuses=(404, 409),
                                      body="OllamaModelBody")},
        "/api/pull": {"post": _op("/api/pull", "Pull a model from the hub (NDJSON progress unless stream is false)",
                                  _ref("PullStatus"), statuses=(404, 409, 502, 507), body="PullBody",
                                  ok_types=(JSON, NDJSON), line=_ref("PullLine"))},
        "/api/create": {"post": _op("/api/create", "A variant of a model: its bytes, with a template, system prompt "
                                    "and default parameters (NDJSON status lines unless stream is false)",
                                    _ref("PullStatus"), statuses=(404, 409), body="CreateBody",
                                    ok_types=(JSON, NDJSON), line=_ref("PullLine"))},
        "/api/chat": {"post": _infer("/api/chat", "Chat", "ChatRequest", "ChatResponse", NDJSON)},
        "/api/generate": {"post": _infer("/api/generate", "Generate", "GenerateRequest", "GenerateResponse", NDJSON)},
        "/api/embed": {"post": _infer("/api/embed", "Embeddings", "EmbedRequest", "EmbedResponse", None)},
        "/api/embeddings": {"post": _infer("/api/embeddings", "Embeddings (legacy)", "EmbeddingsRequest",
                                           "EmbeddingsResponse", None)},
    }
    for path, ops in p.items():
        # Falcon answers OPTIONS on every route (the methods it serves, in Allow).
        ops["options"] = _op(path, "The methods this path serves (Allow); a CORS preflight", None)
        ops["options"]["security"] = []
        ops["options"]["responses"]["204"] = {"description": "a CORS preflight answered"}
        for method, op in ops.items():
            op["operationId"] = f"{method}_{path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}" \
                                if path != "/" else f"{method}_root"
        names = re.findall(r"{(\w+)}", path)
        for op in ops.values() if names else ():
            op.setdefault("parameters", [{"name": n, "in": "path", "required": True, "schema": _STR} for n in names])
    return p


@functools.cache
def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "Blazar", "version": blazar.__version__,
                 "description": "One gateway for local inference: the OpenAI, Anthropic and Ollama dialects, and "
                                "Blazar's own admin routes. Errors take the shape of the route's dialect."},
        "paths": _operations(),
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "a Blazar key (blz_...)"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        # Auth is on only once a key exists (`blazar keys create`): until then no credential is needed.
        "security": [{}, {"bearerAuth": []}, {"apiKey": []}],
    }


class OpenAPIResource:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = document()


def add_routes(api: falcon.asgi.App) -> None:
    api.add_route("/openapi.json", OpenAPIResource())
