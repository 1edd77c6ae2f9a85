"""The JSON-schema pieces the OpenAPI document is built from: the media types, the small types the routes' operations
use, and the answers' shapes by name (`ANSWERS`: the three error shapes and the bodies the routes answer with).
Request bodies are not here: they are the routes' own pydantic models (blazar/api/routes.py `Op.body`)."""

from __future__ import annotations

from typing import Any

JSON = "application/json"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
TEXT = "text/plain"

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


INT: Schema = {"type": "integer"}
STR: Schema = {"type": "string"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
OBJ: Schema = {"type": "object"}
NULLABLE_STR: Schema = {"type": ["string", "null"]}
_NUMBER_RE = r"[0-9]+(\.[0-9]+)?"
DURATION: Schema = {
    "oneOf": [{"type": ["number", "null"]},
              {"type": "string", "pattern": rf"^[+-]?({_NUMBER_RE}|({_NUMBER_RE}(ns|us|µs|ms|s|m|h))+)$"}],
    "description": 'a duration ("5m", "1h30m", "300"), seconds, or negative for forever'}


def listed(item: Schema | None = None) -> Schema:
    """OpenAI's list envelope: {"object": "list", "data": [...]}."""
    data: Schema = {"type": "array", "items": item} if item is not None else {"type": "array"}
    return {"type": "object", "required": ["object", "data"], "properties": {"object": {"const": "list"}, "data": data}}


def obj(required: tuple[str, ...] | list[str] = (), **properties: Schema) -> Schema:
    """An object with these properties (those in `required` must be there)."""
    out: Schema = {"type": "object", "properties": properties}
    if required:
        out["required"] = list(required)
    return out


# -- answers ----------------------------------------------------------------------------------------------------

_USAGE = {"type": "object", "properties": {"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT}}
_OLLAMA_DETAILS = {"type": "object", "properties": {
    "parent_model": STR, "format": STR, "family": STR, "families": {"type": ["array", "null"], "items": STR},
    "parameter_size": STR, "quantization_level": STR}}
_OLLAMA_STATS = {k: INT for k in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
                                   "eval_count", "eval_duration")}
_TOKEN_FIELDS: Schema = {"token": STR, "logprob": NUM, "bytes": {"type": "array", "items": INT}}
_TOKEN_LOGPROB: Schema = {"type": "object", "required": ["token", "logprob"], "properties": _TOKEN_FIELDS}
_OLLAMA_LOGPROBS: Schema = {"type": "array", "items": {"type": "object", "required": ["token", "logprob"],
                                                       "properties": {**_TOKEN_FIELDS, "top_logprobs": {
                                                           "type": "array", "items": _TOKEN_LOGPROB}}}}

ANSWERS: dict[str, Schema] = {
    # The three error shapes (blazar/api/errors.py renders each by route).
    "OpenAIError": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type"], "properties": {
            # The engine's own refusals are passed on as it wrote them: llama-server's code is the HTTP status.
            "message": STR, "type": STR, "code": {"type": ["string", "integer", "null"]},
            "param": NULLABLE_STR}}}},
    "AnthropicError": {"type": "object", "required": ["type", "error"], "properties": {
        "type": {"const": "error"},
        "error": {"type": "object", "required": ["type", "message"], "properties": {"type": STR,
                                                                                       "message": STR}}}},
    "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": STR}},
    # Admin (/api/blazar/).
    "Instance": {"type": "object", "required": ["instance_id", "model", "slots", "ctx_tokens", "engine_tag"],
                 "properties": {"instance_id": STR, "model": STR, "port": {"type": ["integer", "null"]},
                                "slots": INT, "ctx_tokens": INT, "engine_tag": STR,
                                "load_ms": {"type": ["integer", "null"]}, "embeddings": BOOL}},
    "Ps": {"type": "object", "required": ["instances", "circuits"], "properties": {
        "instances": {"type": "array", "items": OBJ},
        "circuits": {"type": "object", "additionalProperties": NUM, "description": "model → open until (unix s)"}}},
    # OpenAI.
    "RerankList": {"type": "object", "required": ["model", "results", "usage"], "properties": {
        "model": STR, "object": STR, "usage": _USAGE, "results": {"type": "array", "items": {
            "type": "object", "required": ["index", "relevance_score"], "properties": {
                "index": INT, "relevance_score": NUM, "document": {
                    "type": "object", "required": ["text"], "properties": {"text": STR}}}}}}},
    "Model": {"type": "object", "required": ["id", "object", "created", "owned_by"], "properties": {
        "id": STR, "object": {"const": "model"}, "created": INT, "owned_by": STR, "kind": STR,
        "capabilities": {"type": "array", "items": STR}}},
    "ModelList": {"type": "object", "required": ["object", "data"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": ref("Model")}}},
    "ChatCompletion": {"type": "object", "required": ["choices"], "properties": {
        "id": STR, "object": STR, "created": INT, "model": STR, "usage": _USAGE,
        "choices": {"type": "array", "items": {"type": "object", "properties": {
            "index": INT, "message": OBJ, "finish_reason": NULLABLE_STR}}}}},
    "Completion": {"type": "object", "required": ["choices"], "properties": {
        "id": STR, "object": STR, "created": INT, "model": STR, "usage": _USAGE,
        "choices": {"type": "array", "items": {"type": "object", "properties": {
            "index": INT, "text": STR, "finish_reason": NULLABLE_STR}}}}},
    "EmbeddingList": {"type": "object", "required": ["data"], "properties": {
        "object": STR, "model": STR, "usage": _USAGE, "data": {"type": "array", "items": {
            "type": "object", "required": ["embedding"], "properties": {
                "index": INT, "object": STR, "embedding": {"type": ["array", "string"], "items": NUM}}}}}},
    "Response": {"type": "object", "description": "a Response: output items (message, function_call) and usage",
                 "required": ["id", "object", "output"], "properties": {
                     "id": STR, "object": {"const": "response"}, "status": STR, "model": STR,
                     "output": {"type": "array", "items": OBJ}, "usage": {"type": ["object", "null"]}}},
    # Anthropic.
    "Message": {"type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
                "properties": {
                    "id": STR, "type": {"const": "message"}, "role": {"const": "assistant"}, "model": STR,
                    "content": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
                        "type": {"enum": ["text", "thinking", "tool_use"]}, "text": STR, "thinking": STR,
                        "id": STR, "name": STR, "input": OBJ}}},
                    "stop_reason": NULLABLE_STR, "stop_sequence": NULLABLE_STR,
                    "usage": {"type": "object", "required": ["input_tokens", "output_tokens"], "properties": {
                        k: INT for k in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                                          "cache_creation_input_tokens")}}}},
    "TokenCount": {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": INT}},
    # Ollama.
    "Tags": {"type": "object", "required": ["models"], "properties": {"models": {"type": "array", "items": {
        "type": "object", "required": ["name", "model", "modified_at", "size", "digest", "details"], "properties": {
            "name": STR, "model": STR, "modified_at": STR, "size": INT, "digest": STR,
            "details": _OLLAMA_DETAILS}}}}},
    "OllamaPs": {"type": "object", "required": ["models"], "properties": {"models": {"type": "array", "items": {
        "type": "object", "required": ["name", "model", "size", "expires_at"], "properties": {
            "name": STR, "model": STR, "size": INT, "digest": STR, "details": _OLLAMA_DETAILS,
            "expires_at": STR, "size_vram": INT, "context_length": {"type": ["integer", "null"]}}}}}},
    "Show": {"type": "object", "required": ["details", "model_info", "capabilities"], "properties": {
        "modelfile": STR, "parameters": STR, "template": STR, "system": STR, "details": _OLLAMA_DETAILS,
        "model_info": OBJ, "capabilities": {"type": "array", "items": STR}, "modified_at": STR,
        "blazar": {"type": "object", "properties": {"completion_only": BOOL, "template_source": {
            "enum": ["settings", "gguf", "probe", "architecture", "fallback"]}, "template": STR}}}},
    "ChatResponse": {"type": "object", "required": ["model", "created_at", "message", "done"], "properties": {
        "model": STR, "created_at": STR, "done": BOOL, "done_reason": STR, **_OLLAMA_STATS,
        "message": {"type": "object", "required": ["role", "content"], "properties": {
            "role": STR, "content": STR, "thinking": STR, "tool_calls": {"type": "array"}}},
        "logprobs": _OLLAMA_LOGPROBS}},
    "GenerateResponse": {"type": "object", "required": ["model", "created_at", "response", "done"], "properties": {
        "model": STR, "created_at": STR, "response": STR, "thinking": STR, "done": BOOL, "done_reason": STR,
        "logprobs": _OLLAMA_LOGPROBS, **_OLLAMA_STATS}},
    "EmbedResponse": {"type": "object", "required": ["model", "embeddings"], "properties": {
        "model": STR, "embeddings": {"type": "array", "items": {"type": "array", "items": NUM}},
        "total_duration": INT, "load_duration": INT, "prompt_eval_count": INT}},
    "EmbeddingsResponse": {"type": "object", "required": ["embedding"], "properties": {
        "embedding": {"type": "array", "items": NUM}}},
    "PullStatus": {"type": "object", "required": ["status"], "properties": {"status": {"const": "success"}}},
    "PullLine": {"oneOf": [
        {"type": "object", "required": ["status"], "properties": {"status": STR, "digest": STR, "total": INT,
                                                                   "completed": INT}},
        ref("OllamaError")]},
}
