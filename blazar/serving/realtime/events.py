"""The Realtime protocol's events as the official `openai` SDK sends and parses them (its `types/realtime/`): what a
client may send, checked with pydantic, and the server events built as plain dicts. Pure: no I/O."""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The input audio buffer's events: served by a session that hears (blazar/serving/realtime/hearing.py).
HEAR_EVENTS = frozenset({"input_audio_buffer.append", "input_audio_buffer.commit", "input_audio_buffer.clear"})


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class SessionAsked(Loose):
    """The fields of `session.update`'s session that a text session reads (others are accepted and kept out)."""

    instructions: str | None = Field(default=None, max_length=65536)
    output_modalities: list[Literal["text", "audio"]] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_output_tokens: int | Literal["inf"] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    audio: dict[str, Any] | None = None


class Part(Loose):
    type: Literal["input_text", "text", "output_text", "input_audio", "input_image", "output_audio"]
    text: str | None = None


class ItemAsked(Loose):
    """A `conversation.item.create`'s item: a message with text parts, or a function call or its output (their
    fields, `call_id`, `name`, `arguments`, `output`, are checked by blazar/serving/realtime/tools.py)."""

    id: str | None = Field(default=None, max_length=64)
    type: Literal["message", "function_call", "function_call_output"]
    role: Literal["user", "assistant", "system"] | None = None
    content: list[Part] = Field(default_factory=list, max_length=64)


class ResponseAsked(Loose):
    instructions: str | None = Field(default=None, max_length=65536)
    output_modalities: list[Literal["text", "audio"]] | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    conversation: str | None = None
    tools: list[dict[str, Any]] | None = None  # the session's, for this response
    tool_choice: str | dict[str, Any] | None = None
    audio: dict[str, Any] | None = None  # `output`: this response's format, voice (serving/realtime/output.py)


class TruncateAsked(Loose):
    """`conversation.item.truncate`: an assistant audio item cut at the audio the user heard."""

    item_id: str = Field(max_length=64)
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


def event(type_: str, **fields: Any) -> dict[str, Any]:
    """A server event: its type, a fresh event id, and its fields."""
    return {"type": type_, "event_id": new_id("event"), **fields}


def error(message: str, *, code: str, kind: str = "invalid_request_error", param: str | None = None,
          event_id: str | None = None) -> dict[str, Any]:
    """An `error` event; `event_id` names the client event it answers."""
    err: dict[str, Any] = {"type": kind, "code": code, "message": message}
    if param is not None:
        err["param"] = param
    if event_id is not None:
        err["event_id"] = event_id
    return event("error", error=err)
