"""A forced tool choice (OpenAI's `required` or a named function; Anthropic's `any` or `tool`) is enforced by
Blazar, not left to the chat template: the engine's own grammar for a forced call still lets a model write free text
first, so a small model may never reach the call. Blazar asks instead for JSON matching
`{"name": <one of the tools>, "arguments": <that tool's parameters>}` (a grammar the engine enforces token by
token), keeps the tools in the prompt, and turns the answer back into an ordinary OpenAI tool call, for a plain
answer and for a stream. Every dialect sees ordinary `tool_calls` after this; a call cut short by max_tokens is
no call and no text (`finish_reason: length`, content null).

The grammar is Blazar's compact one (blazar/dialects/grammar.py: no whitespace between tokens), and so is a client's
structured output (`response_format` json_schema / json_object, and what the other dialects translate to it): the
engine's own schema conversion lets a model pad the JSON with spaces and newlines at every comma. A schema the
compact converter cannot express goes as the `response_format` the engine converts itself.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from blazar.dialects.errors import DialectError
from blazar.dialects.grammar import any_object_grammar, schema_grammar
from blazar.dialects.stream import Translator, sse
from blazar.errors import GrammarUnsupported

SCHEMA_NAME = "tool_call"
# How a forced call ended: made (a whole call), or cut by max_tokens before its JSON was whole.
ForcedOutcome = Literal["made", "cut"]


@dataclass
class Forced:
    names: list[str]
    # What the answer was, once judged (`request.completed` records it): None until then, or when it was neither
    # (a client's stop sequence cut it: the text is passed on as it is).
    outcome: ForcedOutcome | None = None

    def judge(self, answer: Any) -> ForcedOutcome | None:
        """A whole chat completion's first choice: a call, a call cut by max_tokens, or neither (kept as `outcome`)."""
        choices = answer.get("choices") if isinstance(answer, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        message = choice.get("message") or {}
        self.outcome = self._outcome(message.get("content"), choice.get("finish_reason"))
        return self.outcome

    def _outcome(self, text: Any, finish: Any) -> ForcedOutcome | None:
        if self._parse(text) is not None:
            return "made"
        return "cut" if finish == "length" else None

    def answer(self, answer: dict[str, Any]) -> dict[str, Any]:
        """A non-stream chat completion: its JSON content becomes a tool call. One cut by max_tokens is no call and
        no text (content null, finish_reason length): half a call's JSON is neither an answer nor a call."""
        self.judge(answer)
        for choice in answer.get("choices") or []:
            msg = choice.get("message") or {}
            call = self._parse(msg.get("content"))
            if call is not None:
                msg["content"] = None
                msg["tool_calls"] = [call]
                choice["finish_reason"] = "tool_calls"
            elif choice.get("finish_reason") == "length":
                msg["content"] = None
                msg.pop("tool_calls", None)
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
    # NOTE: the engine takes a `grammar` beside tools only while tool_choice is "none"; the tools stay in the prompt
    # and the grammar does the forcing.
    body["tool_choice"] = "none"
    grammar = _compact(schema) if "json_schema" not in body else None  # the engine refuses both together
    if grammar is not None:
        body["grammar"] = grammar
    else:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "schema": schema}}
    return Forced(chosen)


def compact_format(body: dict[str, Any]) -> None:
    """A chat body's structured output (`response_format` json_schema or json_object) as the compact grammar, in
    place, where the converter can express the schema; else the body is left as it is (the engine converts it).
    A body that already names a `grammar` or `json_schema` (the engine's own fields) is the client's to keep, and
    one with tools the model may call is left to the engine (it takes a grammar beside tools only with tool_choice
    "none")."""
    rf = body.get("response_format")
    if not isinstance(rf, dict) or "grammar" in body or "json_schema" in body:
        return
    if body.get("tools") and body.get("tool_choice") != "none":
        return
    kind = rf.get("type")
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
    elif kind == "json_object":
        schema = rf.get("schema")  # llama-server's extension: json_object with a schema
    else:
        return
    # As the engine reads them: no schema, or an empty one, means any object.
    grammar = any_object_grammar() if schema is None or schema == {} else _compact(schema)
    if grammar is not None:
        del body["response_format"]
        body["grammar"] = grammar


def constrain(body: dict[str, Any]) -> Forced | None:
    """What a chat body asks of the engine's grammar, rewritten in place: a forced tool call (its Forced), or else
    the structured output."""
    forced = force(body)
    if forced is None:
        compact_format(body)
    return forced


def _compact(schema: Any) -> str | None:
    try:
        return schema_grammar(schema)
    except GrammarUnsupported:
        return None


class OpenAIStream:
    """OpenAI's own SSE, re-encoded (used when a forced call had to be rewritten in an OpenAI stream, or the loop
    guard reads the answer), each chunk's model named as the client named it."""

    content_type = "text/event-stream"

    def __init__(self, model: str | None = None) -> None:
        self.model = model

    def event(self, chunk: dict[str, Any]) -> bytes:
        if self.model is not None and "model" in chunk:
            chunk["model"] = self.model
        return sse(chunk)

    def heartbeat(self) -> bytes:
        return b": ping\n\n"  # an SSE comment, which every client skips

    def end(self) -> bytes:
        return b"data: [DONE]\n\n"

    def error(self, message: str) -> bytes:
        return sse({"error": {"message": message, "type": "server_error", "code": "engine_error"}})


@dataclass
class ForcedStream:
    """Holds back a forced call's JSON text while it streams, then hands `inner` one tool-call delta and the finish
    chunk (finish_reason `tool_calls`), or, cut by max_tokens, the finish chunk alone (`length`); everything else
    passes through unchanged."""

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
        text = "".join(self._text)
        self.forced.outcome = self.forced._outcome(text, choice["finish_reason"])
        call = self.forced._parse(text)
        if call is None:
            if self.forced.outcome == "cut":  # max_tokens: no call, and no half-written JSON either
                return self.inner.event(chunk)
            # Neither a call nor cut by max_tokens (a client's stop sequence): the text as it is.
            held = {**chunk, "choices": [{**choice, "delta": {"content": text}, "finish_reason": None}]}
            return self.inner.event(held) + self.inner.event(chunk)
        head = {**chunk, "choices": [{"index": 0, "finish_reason": None,
                                      "delta": {"tool_calls": [{"index": 0, **call}]}}]}
        head.pop("timings", None)
        head.pop("usage", None)
        tail = {**chunk, "choices": [{**choice, "delta": {}, "finish_reason": "tool_calls"}]}
        return self.inner.event(head) + self.inner.event(tail)

    def heartbeat(self) -> bytes:
        return self.inner.heartbeat()

    def end(self) -> bytes:
        return self.inner.end()

    def error(self, message: str) -> bytes:
        return self.inner.error(message)
