"""The Anthropic Messages request body (`POST /v1/messages`): the fields blazar/dialects/anthropic.py reads, typed.
It validates each request before `to_openai` translates it and is the body the OpenAPI document shows. Unknown keys
are accepted and ignored, as they were before it existed; the nested shapes (turns, blocks, tools) are documented here
and checked by the translator, whose messages name the block at fault."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, WithJsonSchema

_STR = {"type": "string"}
_BLOCK = {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string", "enum": ["text", "image", "tool_use", "tool_result", "thinking"]}}}
_TEXT_BLOCKS = {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                                           "properties": {"type": {"const": "text"}, "text": _STR}}}
MESSAGES: dict[str, Any] = {
    "type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role", "content"], "properties": {
            "role": {"type": "string", "enum": ["user", "assistant", "system"]},
            "content": {"oneOf": [_STR, {"type": "array", "items": _BLOCK}]}}}}
_TOOLS = {"type": ["array", "null"], "items": {"type": "object", "required": ["name", "input_schema"], "properties": {
    "name": _STR, "description": _STR, "input_schema": {"type": "object"}}}}
_TOOL_CHOICE = {"type": ["object", "null"], "required": ["type"], "properties": {
    "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]}, "name": _STR,
    "disable_parallel_tool_use": {"type": "boolean"}}}
_NUMBER = StrictFloat | StrictInt | None
_THINKING = {"type": ["object", "null"], "required": ["type"], "description": "the thinking's budget in tokens "
             "(enabled: >= 1024 and below max_tokens; a model's own budget may lower it)", "properties": {
                 "type": {"enum": ["enabled", "disabled", "adaptive"]}, "budget_tokens": {"type": "integer",
                                                                                         "minimum": 1024}}}


class MessagesBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1)
    max_tokens: StrictInt = Field(ge=1)
    messages: Annotated[list[Any], WithJsonSchema(MESSAGES)] = Field(min_length=1)
    system: Annotated[StrictStr | list[Any] | None, WithJsonSchema({"oneOf": [_STR, _TEXT_BLOCKS, {"type": "null"}]})
                      ] = None
    stream: StrictBool | None = None
    temperature: _NUMBER = None
    top_p: _NUMBER = None
    top_k: StrictInt | None = None
    stop_sequences: list[StrictStr] | None = None
    tools: Annotated[list[Any] | None, WithJsonSchema(_TOOLS)] = None
    tool_choice: Annotated[dict[str, Any] | None, WithJsonSchema(_TOOL_CHOICE)] = None
    output_config: dict[str, Any] | None = Field(None, description='{"format": {"type": "json_schema", "schema": '
                                                                   '{...}}}: structured output')
    context_management: dict[str, Any] | None = Field(None, description="only clear_thinking edits (done already: "
                                                                        "earlier thinking never reaches the engine)")
    lora: Any = Field(None, description="LoRA adapters by name, checked against the model's (Blazar's own)")
    thinking: Annotated[Any, WithJsonSchema(_THINKING)] = None
    # Accepted and ignored (anthropic.py _IGNORED): what Anthropic's servers do that a local engine has no use for.
    metadata: Any = None
    service_tier: Any = None
    container: Any = None
    mcp_servers: Any = None


class CountBody(MessagesBody):
    """`POST /v1/messages/count_tokens`: a Messages body without max_tokens (the count is the prompt's)."""

    model_config = ConfigDict(extra="allow", title="CountTokensBody")

    max_tokens: StrictInt = Field(1, ge=1)
