"""The Responses request body (`POST /v1/responses`): the fields blazar/dialects/responses.py reads, typed. The route
checks it before the caller is known (the model, whether it streams) and `read` before it translates; it is the body
the OpenAPI document shows. Unknown keys are accepted and ignored (OpenAI's SDKs send fields Blazar has no use for);
the items, tools and formats inside are checked by the translator, whose messages name the item at fault."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, WithJsonSchema

from blazar.events.requests import REASONING_EFFORTS

_NUMBER = StrictFloat | StrictInt | None
_INPUT = {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "object"}}],
          "description": "a user message's text, or the input items (messages, function calls and their outputs)"}
_TOOL_CHOICE = {"oneOf": [{"enum": ["auto", "none", "required"]},
                          {"type": "object", "required": ["type"], "properties": {
                              "type": {"enum": ["function", "custom", "local_shell"]}, "name": {"type": "string"},
                              "namespace": {"type": "string"}}},
                          {"type": "null"}]}
_TEXT = {"type": ["object", "null"], "properties": {"format": {"type": "object", "required": ["type"], "properties": {
    "type": {"enum": ["text", "json_object", "json_schema"]}}}}}


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1)
    input: Annotated[StrictStr | list[Any], WithJsonSchema(_INPUT)]
    stream: StrictBool = False
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    instructions: StrictStr | None = None
    store: StrictBool | None = Field(None, description="absent or null: stored")
    previous_response_id: StrictStr | None = Field(None, min_length=1)
    tools: Annotated[list[Any] | None, WithJsonSchema({"type": ["array", "null"], "items": {"type": "object"}})] = None
    tool_choice: Annotated[StrictStr | dict[str, Any] | None, WithJsonSchema(_TOOL_CHOICE)] = None
    parallel_tool_calls: StrictBool | None = None
    temperature: _NUMBER = None
    top_p: _NUMBER = None
    text: Annotated[dict[str, Any] | None, WithJsonSchema(_TEXT)] = None
    metadata: dict[StrictStr, StrictStr] | None = None
    lora: Any = Field(None, description="LoRA adapters by name, checked against the model's (Blazar's own)")
    reasoning: Annotated[Any, WithJsonSchema({
        "type": ["object", "null"], "description": "effort: a budget of thinking tokens (docs/8.GATEWAY.md, "
        "Reasoning); summary is not read", "properties": {"effort": {"enum": [*REASONING_EFFORTS, None]}}})] = None
    # Refused unless off: what OpenAI's servers keep for a client (a background run, a conversation object).
    background: Annotated[Any, WithJsonSchema({"type": ["boolean", "null"], "description": "refused when true"})] = None
    conversation: Annotated[Any, WithJsonSchema({"type": "null", "description": "refused: chain responses with "
                                                                                 "previous_response_id"})] = None
