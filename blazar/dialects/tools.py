"""A forced tool choice (OpenAI's `required` or a named function; Anthropic's `any` or `tool`) is enforced by
Blazar, not left to the chat template: the engine's own grammar for a forced call still lets a model write free text
first, so a small model may never reach the call. Blazar asks instead for JSON matching
`{"name": <one of the tools>, "arguments": <that tool's parameters>}` (a JSON-schema grammar the engine enforces
token by token), keeps the tools in the prompt, and turns the answer back into an ordinary OpenAI tool call, for a
plain answer and for a stream. Every dialect sees ordinary `tool_calls` after this.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from blazar.dialects.errors import DialectError
from blazar.dialects.stream import Translator, sse

SCHEMA_NAME = "tool_call"


@dataclass
class Forced:
    names: list[str]

    def answer(self, answer: dict[str, Any]) -> dict[str, Any]:
        """A non-stream chat completion: its JSON content becomes a tool call (an unfinished one, cut by max_tokens,
        stays text so the client sees what there was)."""
        for choice in answer.get("choices") or []:
            msg = choice.get("message") or {}
            call = self._parse(msg.get("content"))
            if call is not None:
                msg["content"] = None
                msg["tool_calls"] = [call]
                choice["finish_reason"] = "tool_calls"
        return answer

    def _parse(self, text: Any) -> dict[str, Any] | None:
        if not isinstance(text, str):
            return None
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(data, dict) or data.get("name") not in self.names:
            return None
        args = orjson.dumps(data.get("arguments") or {}).decode()
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": data["name"], "arguments": args}}


def force(body: dict[str, Any]) -> Forced | None:
    """Rewrite an OpenAI chat body whose tool_choice forces a call (in place); None when nothing is forced."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools or choice is None or choice in ("auto", "none"):
        return None
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    if choice == "required":
        chosen = list(by_name)
    elif isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or name not in by_name:
            raise DialectError(f"tool_choice.function.name: {name!r} is not one of the tools ({', '.join(by_name)})")
        chosen = [name]
    else:
        raise DialectError("tool_choice: must be 'auto', 'none', 'required' or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") not in (None, "text"):
        raise DialectError("response_format: cannot be combined with a tool_choice that forces a tool call")
    options = [{"type": "object",
                "properties": {"name": {"const": n},
                               "arguments": by_name[n].get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"]} for n in chosen]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    body["tool_choice"] = "none"  # the tools stay in the prompt; the grammar below does the forcing
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "schema": schema}}
    return Forced(chosen)


class OpenAIStream:
    """OpenAI's own SSE, re-encoded (used when a forced call had to be rewritten in an OpenAI stream)."""

    content_type = "text/event-stream"

    def event(self, chunk: dict[str, Any]) -> bytes:
        return sse(chunk)

    def end(self) -> bytes:
        return b"data: [DONE]\n\n"

    def error(self, message: str) -> bytes:
        return sse({"error": {"message": message, "type": "server_error", "code": "engine_error"}})


@dataclass
class ForcedStream:
    """Holds back a forced call's JSON text while it streams, then hands `inner` one tool-call delta and the finish
    chunk (finish_reason `tool_calls`); everything else passes through unchanged."""

    forced: Forced
    inner: Translator
    _text: list[str] = field(default_factory=list)

    @property
    def content_type(self) -> str:
        return self.inner.content_type

    def event(self, chunk: dict[str, Any]) -> bytes:
        choices = chunk.get("choices")
        if not choices:
            return self.inner.event(chunk)
        choice = choices[0]
        delta = choice.get("delta") or {}
        text = delta.get("content")
        if text:
            self._text.append(text)
            delta = {k: v for k, v in delta.items() if k != "content"}
            if not delta and not choice.get("finish_reason"):
                return b""
            chunk = {**chunk, "choices": [{**choice, "delta": delta}]}
        if not choice.get("finish_reason"):
            return self.inner.event(chunk)
        call = self.forced._parse("".join(self._text))
        if call is None:  # cut short (max_tokens): the text as it is
            held = {**chunk, "choices": [{**choice, "delta": {"content": "".join(self._text)},
                                          "finish_reason": None}]}
            return self.inner.event(held) + self.inner.event(chunk)
        head = {**chunk, "choices": [{"index": 0, "finish_reason": None,
                                      "delta": {"tool_calls": [{"index": 0, **call}]}}]}
        head.pop("timings", None)
        head.pop("usage", None)
        tail = {**chunk, "choices": [{**choice, "delta": {}, "finish_reason": "tool_calls"}]}
        return self.inner.event(head) + self.inner.event(tail)

    def end(self) -> bytes:
        return self.inner.end()

    def error(self, message: str) -> bytes:
        return self.inner.error(message)
