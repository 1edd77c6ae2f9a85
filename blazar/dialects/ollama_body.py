"""The Ollama request bodies (/api/chat, /api/generate, /api/embed, /api/embeddings) and the `options` each may
carry: the fields blazar/dialects/ollama.py reads, typed. Each validates its request before the translator runs and
is the body the OpenAPI document shows. Unknown top-level keys are ignored, as Ollama does; an unknown option is a
400 (as in Ollama), so the options' names are here too."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, WithJsonSchema

from blazar.dialects.body import DURATION

FLOAT_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "min_p": "min_p", "typical_p": "typical_p",
                 "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
                 "frequency_penalty": "frequency_penalty", "mirostat_tau": "mirostat_tau",
                 "mirostat_eta": "mirostat_eta"}
INT_OPTIONS = {"top_k": "top_k", "seed": "seed", "repeat_last_n": "repeat_last_n", "mirostat": "mirostat",
               "num_keep": "n_keep"}
# NOTE: load-time runner options Ollama accepts per request. Blazar plans batch, offload, threads and memory
# itself (the fit planner), so these are accepted and ignored rather than refused; tfs_z is gone from llama.cpp.
IGNORED_OPTIONS = frozenset({"num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap", "use_mlock", "low_vram",
                             "f16_kv", "vocab_only", "numa", "penalize_newline", "logits_all", "embedding_only",
                             "tfs_z"})
# Blazar's own options, validated where the request's options are (blazar/api/request_options.py): spec (off|auto).
BLAZAR_OPTIONS = frozenset({"spec"})
MAX_NUM_CTX = 1 << 24  # past any model's trained context; the fit planner refuses what does not fit anyway
MAX_TOP_LOGPROBS = 20  # Ollama's bound, and OpenAI's

_STR = {"type": "string"}
_ANY: dict[str, Any] = {}  # an ignored option: any value
OPTIONS: dict[str, Any] = {
    "type": ["object", "null"], "description": "sampling options (an unknown one is a 400)",
    "properties": {**{name: {"type": ["number", "null"]} for name in FLOAT_OPTIONS},
                   **{name: {"type": ["integer", "null"]} for name in INT_OPTIONS},
                   "num_predict": {"type": ["integer", "null"], "minimum": -2},
                   "num_ctx": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_NUM_CTX},
                   "stop": {"oneOf": [_STR, {"type": "array", "items": _STR}, {"type": "null"}]},
                   "spec": {"enum": ["off", "auto", False, True, None]},
                   **{name: _ANY for name in sorted(IGNORED_OPTIONS)}},
    "additionalProperties": False}
_MESSAGES = {"type": ["array", "null"], "items": {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]}, "content": _STR,
    "images": {"type": "array", "items": _STR}, "tool_calls": {"type": "array"}, "tool_name": _STR,
    "thinking": _STR}}}
_TOOLS = {"type": ["array", "null"], "items": {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"const": "function"}, "function": {"type": "object"}}}}
_FORMAT = {"oneOf": [{"enum": ["", "json"]}, {"type": "object"}, {"type": "null"}]}
_THINK = {"oneOf": [{"type": ["boolean", "null"]}, {"enum": ["low", "medium", "high", "max"]}]}

Options = Annotated[dict[str, Any] | None, WithJsonSchema(OPTIONS)]
KeepAlive = Annotated[Any, WithJsonSchema(DURATION)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1)
    options: Options = None
    keep_alive: KeepAlive = None


class _Generation(_Body):
    stream: StrictBool | None = None
    format: Annotated[StrictStr | dict[str, Any] | None, WithJsonSchema(_FORMAT)] = None
    think: Annotated[StrictBool | StrictStr | None, WithJsonSchema(_THINK)] = None
    logprobs: StrictBool | None = Field(None, description="refused with raw")
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


class ChatRequest(_Generation):
    messages: Annotated[list[Any] | None, WithJsonSchema(_MESSAGES)] = None
    tools: Annotated[list[Any] | None, WithJsonSchema(_TOOLS)] = None


class GenerateRequest(_Generation):
    prompt: StrictStr | None = None
    system: StrictStr | None = None
    raw: StrictBool | None = None
    images: list[StrictStr] | None = None
    template: StrictStr | None = Field(None, description="refused unless empty")
    suffix: StrictStr | None = Field(None, description="refused unless empty")
    context: Annotated[list[Any] | None, WithJsonSchema({"type": ["array", "null"], "maxItems": 0,
                                                         "description": "refused unless empty"})] = None


class EmbedRequest(_Body):
    input: StrictStr | list[StrictStr] | None = None
    truncate: StrictBool = True
    dimensions: StrictInt | None = Field(None, ge=1)


class EmbeddingsRequest(_Body):
    prompt: StrictStr | None = None
