"""OpenAI's Responses API ↔ the engine's chat API: the request going in (`to_chat`: input items, instructions, tools,
tool_choice, text.format, sampling → a `/v1/chat/completions` body), the answer coming out (`render`: a Response
object with message and function_call items), and the stream (`ResponsesStream`: response.created ...
response.completed). Pure: ids and times come from the caller's `Echo`.

A Responses request is served as the chat request it translates to, so a forced tool choice, a model's settings,
sessions, best-of and cascades apply to it as they do to chat. The conversation a `previous_response_id` names is
the caller's to load (the content store); this module turns stored items back into chat messages (`messages_of`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from blazar.dialects.errors import DialectError
from blazar.dialects.schema import check_schema
from blazar.dialects.stream import named_sse

# NOTE: accepted and ignored: hints with no meaning for a local engine (billing, caching, safety, reasoning effort
# for models that think or not by their template). Unknown keys are ignored too, so a newer SDK still works.
IGNORED = ("reasoning", "truncation", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
           "service_tier", "include", "top_logprobs", "max_tool_calls", "stream_options", "prompt")
_SYSTEM_ROLES = {"system": "system", "developer": "system"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------------------- request


@dataclass(frozen=True)
class Asked:
    """A Responses request, read: the chat body for the engine, the input as stored items, and what the Response
    echoes back."""

    chat: dict[str, Any]  # the engine's chat body, without the history a previous_response_id brings
    items: list[dict[str, Any]]  # this request's input, as items with ids (what input_items lists)
    instructions: str | None
    store: bool
    previous_response_id: str | None
    echo: dict[str, Any]  # the request's fields every Response repeats (tools, tool_choice, temperature, ...)


def read(body: dict[str, Any]) -> Asked:
    """Validate a `POST /v1/responses` body (DialectError names the field) and translate it."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise DialectError("model: required, a non-empty string")
    if body.get("background"):
        raise DialectError("background: responses run in the foreground here (background: true is not supported)")
    if body.get("conversation") is not None:
        raise DialectError("conversation: not supported; chain responses with previous_response_id")
    instructions, store, previous = _state(body)
    items = input_items(body.get("input"))
    chat: dict[str, Any] = {"model": model, "messages": messages_of(items)}
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), tools, chat)
    _sampling(body, chat)
    text = _text_format(body.get("text"), chat)
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise DialectError("metadata: expected an object of strings")
    echo = {"tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "max_output_tokens": chat.get("max_tokens"), "text": text, "metadata": metadata or {}, "store": store,
            "previous_response_id": previous, "instructions": instructions}
    return Asked(chat=chat, items=items, instructions=instructions, store=store, previous_response_id=previous,
                 echo=echo)


def _state(body: dict[str, Any]) -> tuple[str | None, bool, str | None]:
    """(instructions, store, previous_response_id), checked."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise DialectError("instructions: expected a string")
    store = body.get("store", True)
    store = True if store is None else store  # absent or null: stored, as OpenAI does
    if not isinstance(store, bool):
        raise DialectError("store: expected a boolean")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise DialectError("previous_response_id: expected a response id")
    return instructions, store, previous


def _sampling(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """max_output_tokens, temperature, top_p, parallel_tool_calls and stream into the chat body, each checked."""
    if body.get("parallel_tool_calls") is not None:
        if not isinstance(body["parallel_tool_calls"], bool):
            raise DialectError("parallel_tool_calls: expected a boolean")
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise DialectError("max_output_tokens: expected an integer >= 1")
        chat["max_tokens"] = limit
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            if not _is_number(body[key]):
                raise DialectError(f"{key}: expected a number")
            chat[key] = body[key]
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise DialectError("stream: expected a boolean")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}


def with_history(asked: Asked, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages for `asked` after the stored items of the conversation it continues: instructions first
    (this request's own: an earlier request's are not carried over), then the history, then the new input."""
    system = [{"role": "system", "content": asked.instructions}] if asked.instructions else []
    return system + messages_of(history + asked.items)


def chat_messages(asked: Asked) -> list[dict[str, Any]]:
    return with_history(asked, [])


def input_items(value: Any) -> list[dict[str, Any]]:
    """The request's `input` (a string, or a list of items) as items with ids, in the shapes input_items lists."""
    if isinstance(value, str):
        return [{"id": new_id("msg"), "type": "message", "role": "user", "status": "completed",
                 "content": [{"type": "input_text", "text": value}]}]
    if not isinstance(value, list) or not value:
        raise DialectError("input: required, a string or a non-empty list of items")
    out = []
    for i, item in enumerate(value):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise DialectError(f"{where}: expected an item object")
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message_item(item, where))
        elif kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                if not isinstance(item.get(name), str):
                    raise DialectError(f"{where}.{name}: required, a string")
            out.append({"id": _id_or(item, "fc"), "type": "function_call", "call_id": item["call_id"],
                        "name": item["name"], "arguments": item["arguments"], "status": "completed"})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not item["call_id"]:
                raise DialectError(f"{where}.call_id: required, a string")
            output = item.get("output")
            if isinstance(output, list):
                output = "\n".join(_part_text(p, f"{where}.output.{j}") for j, p in enumerate(output))
            if not isinstance(output, str):
                raise DialectError(f"{where}.output: expected a string or a list of text parts")
            out.append({"id": _id_or(item, "fco"), "type": "function_call_output", "call_id": item["call_id"],
                        "output": output, "status": "completed"})
        elif kind == "reasoning":
            continue  # NOTE: the engine re-thinks each turn; earlier reasoning is not replayed to it
        else:
            raise DialectError(f"{where}.type: {kind!r} items are not supported (message, function_call, "
                               "function_call_output)")
    if not out:
        raise DialectError("input: no message or function call items")
    return out


def _id_or(item: dict[str, Any], prefix: str) -> str:
    given = item.get("id")
    return given if isinstance(given, str) and given else new_id(prefix)


def _message_item(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise DialectError(f"{where}.role: expected 'user', 'assistant', 'system' or 'developer', got {role!r}")
    content = item.get("content")
    kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        parts: list[dict[str, Any]] = [{"type": kind, "text": content}]
    elif isinstance(content, list):
        parts = [_part(p, f"{where}.content.{j}", role) for j, p in enumerate(content)]
    else:
        raise DialectError(f"{where}.content: expected a string or a list of content parts")
    if role == "assistant":
        for p in parts:
            p.setdefault("annotations", [])
    return {"id": _id_or(item, "msg"), "type": "message", "role": role, "status": "completed", "content": parts}


def _part(part: Any, where: str, role: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise DialectError(f"{where}: expected a content part object")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "refusal"):
        text = part.get("refusal") if kind == "refusal" else part.get("text")
        if not isinstance(text, str):
            raise DialectError(f"{where}.text: expected a string")
        return {"type": "output_text" if role == "assistant" else "input_text", "text": text}
    if kind == "input_image" and role != "assistant":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise DialectError(f"{where}.image_url: required (a URL or a data: URL; file_id is not supported)")
        return {"type": "input_image", "image_url": url, "detail": part.get("detail") or "auto"}
    raise DialectError(f"{where}.type: {kind!r} content is not supported here")


def _part_text(part: Any, where: str) -> str:
    if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text") \
            and isinstance(part.get("text"), str):
        return str(part["text"])
    raise DialectError(f"{where}: only text parts are supported")


def messages_of(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored items (as `input_items` made them, or a Response's output) → chat messages. Function calls join the
    assistant turn before them (one assistant message holds its text and its calls, as chat has it)."""
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            role = str(item["role"])
            parts = item.get("content") or []
            if any(p.get("type") == "input_image" for p in parts):
                content: Any = [{"type": "text", "text": p["text"]} if p.get("type") != "input_image"
                                else {"type": "image_url", "image_url": {"url": p["image_url"]}} for p in parts]
            else:
                content = "\n".join(str(p.get("text", "")) for p in parts)
            out.append({"role": _SYSTEM_ROLES.get(role, role), "content": content})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise DialectError("tools: expected a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise DialectError(f"tools.{i}: expected an object")
        if tool.get("type") != "function":
            raise DialectError(f"tools.{i}.type: {tool.get('type')!r} tools are not supported (function tools are)")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise DialectError(f"tools.{i}.name: required, a string")
        fn: dict[str, Any] = {"name": name, "parameters": tool.get("parameters") or {"type": "object"}}
        check_schema(fn["parameters"], f"tools.{i}.parameters")
        if tool.get("description") is not None:
            if not isinstance(tool["description"], str):
                raise DialectError(f"tools.{i}.description: expected a string")
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, tools: list[dict[str, Any]], chat: dict[str, Any]) -> None:
    if choice is None:
        return
    names = [t["function"]["name"] for t in tools]
    if choice in ("auto", "none", "required"):
        mapped: Any = choice
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise DialectError(f"tool_choice.name: {name!r} is not one of the tools ({', '.join(names)})")
        mapped = {"type": "function", "function": {"name": name}}
    else:
        raise DialectError("tool_choice: expected 'auto', 'none', 'required' or {\"type\": \"function\", "
                           "\"name\": ...}")
    if mapped not in ("auto", "none") and not tools:
        raise DialectError("tool_choice: forcing a tool call needs tools")
    if tools:
        chat["tool_choice"] = mapped


def _text_format(text: Any, chat: dict[str, Any]) -> dict[str, Any]:
    """`text.format` → the chat `response_format`; what the Response echoes as its `text`."""
    if text is None:
        return {"format": {"type": "text"}}
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(text, dict) or (fmt is not None and not isinstance(fmt, dict)):
        raise DialectError("text: expected {\"format\": {\"type\": ...}}")
    if fmt is None or fmt.get("type") == "text":
        return {"format": {"type": "text"}}
    kind = fmt.get("type")
    if kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind == "json_schema":
        name = fmt.get("name") or "output"
        schema = check_schema(fmt.get("schema"), "text.format.schema")
        spec: dict[str, Any] = {"name": name, "schema": schema}
        if fmt.get("strict") is not None:
            spec["strict"] = bool(fmt["strict"])
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}
    else:
        raise DialectError(f"text.format.type: expected 'text', 'json_object' or 'json_schema', got {kind!r}")
    return {"format": fmt}


# ---------------------------------------------------------------------------------------------------- answer


@dataclass(frozen=True)
class Echo:
    """What one Response says of itself beside its output: its id and time (the caller's), the model as the client
    named it, and the request's fields it repeats."""

    id: str
    created_at: int
    model: str
    fields: dict[str, Any] = field(default_factory=dict)

    def response(self, *, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                 incomplete: bool = False) -> dict[str, Any]:
        f = self.fields
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": False, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": f.get("instructions"), "max_output_tokens": f.get("max_output_tokens"),
            "model": self.model, "output": output, "parallel_tool_calls": f.get("parallel_tool_calls", True),
            "previous_response_id": f.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None}, "store": f.get("store", True),
            "temperature": f.get("temperature"), "text": f.get("text") or {"format": {"type": "text"}},
            "tool_choice": f.get("tool_choice", "auto"), "tools": f.get("tools", []), "top_p": f.get("top_p"),
            "truncation": "disabled", "usage": usage, "user": None, "metadata": f.get("metadata") or {},
        }


def usage_of(usage: Any) -> dict[str, Any]:
    """The engine's chat usage → a Response's."""
    u = usage if isinstance(usage, dict) else {}
    details = u.get("prompt_tokens_details")
    cached = (details.get("cached_tokens") if isinstance(details, dict) else 0) or 0
    prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def _text_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def render(answer: dict[str, Any], echo: Echo) -> dict[str, Any]:
    """The engine's whole chat completion → a Response (cut by the output limit: status incomplete)."""
    choices = answer.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    cut = choice.get("finish_reason") == "length"
    status = "incomplete" if cut else "completed"
    output: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        output.append(_reasoning_item(new_id("rs"), str(message["reasoning_content"]), "completed"))
    if message.get("content"):
        output.append(_text_item(new_id("msg"), str(message["content"]), status))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        output.append(_call_item(new_id("fc"), call.get("id") or new_id("call"), fn.get("name") or "",
                                 fn.get("arguments") or "{}", "completed"))
    return echo.response(status=status, output=output, usage=usage_of(answer.get("usage")), incomplete=cut)


# ---------------------------------------------------------------------------------------------------- stream


class ResponsesStream:
    """The engine's chat.completion.chunk stream → the Responses API's named SSE events: response.created and
    response.in_progress, then per output item its added / delta... / done events, then response.completed (or
    response.incomplete when cut by the output limit). `done`, when given, gets the final Response before its last
    event is sent (where the caller stores it)."""

    content_type = "text/event-stream"

    def __init__(self, echo: Echo, done: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._echo = echo
        self._done = done
        self._seq = 0
        self._started = False
        self._ended = False
        self._output: list[dict[str, Any]] = []
        self._text: list[str] | None = None  # the open message or reasoning item's text, while it is open
        self._calls: dict[int, int] = {}  # the engine's tool-call index → our output index
        self._finish: str | None = None
        self._usage: Any = None

    def _event(self, kind: str, **payload: Any) -> bytes:
        out = named_sse(kind, {"type": kind, "sequence_number": self._seq, **payload})
        self._seq += 1
        return out

    def _start(self) -> bytes:
        self._started = True
        head = self._echo.response(status="in_progress", output=[], usage=None)
        return self._event("response.created", response=head) + self._event("response.in_progress", response=head)

    def _close_text(self) -> bytes:
        """Close the open message or reasoning item, if one is open."""
        if self._text is None:
            return b""
        index = len(self._output) - 1
        item = self._output[index]
        text = "".join(self._text)
        self._text = None
        if item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            item["status"] = "completed"
            return (self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                content_index=0, text=text)
                    + self._event("response.output_item.done", output_index=index, item=item))
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item["content"] = [part]
        item["status"] = "incomplete" if self._finish == "length" else "completed"
        return (self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                            text=text, logprobs=[])
                + self._event("response.content_part.done", item_id=item["id"], output_index=index,
                              content_index=0, part=part)
                + self._event("response.output_item.done", output_index=index, item=item))

    def _open(self, kind: str) -> bytes:
        """Open a message or reasoning item for text deltas (closing another kind that is open)."""
        if self._text is not None and self._output[-1]["type"] == kind:
            return b""
        out = self._close_text()
        if kind == "reasoning":
            item = _reasoning_item(new_id("rs"), "", "in_progress")
        else:
            item = _text_item(new_id("msg"), "", "in_progress")
        item["content"] = []
        self._output.append(item)
        self._text = []
        index = len(self._output) - 1
        out += self._event("response.output_item.added", output_index=index, item=dict(item))
        if kind == "message":
            out += self._event("response.content_part.added", item_id=item["id"], output_index=index,
                               content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                      "logprobs": []})
        return out

    def event(self, chunk: dict[str, Any]) -> bytes:
        if self._ended:
            return b""
        out = b"" if self._started else self._start()
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        if not choices:
            return out
        choice = choices[0]
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]
        delta = choice.get("delta") or {}
        for kind, key, event in (("reasoning", "reasoning_content", "response.reasoning_text.delta"),
                                 ("message", "content", "response.output_text.delta")):
            text = delta.get(key)
            if not text:
                continue
            out += self._open(kind)
            assert self._text is not None
            self._text.append(text)
            index = len(self._output) - 1
            extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
            out += self._event(event, item_id=self._output[index]["id"], output_index=index, content_index=0,
                               delta=text, **extra)
        for call in delta.get("tool_calls") or []:
            out += self._call_delta(call)
        return out

    def _call_delta(self, call: dict[str, Any]) -> bytes:
        out = self._close_text()
        position = call.get("index", 0)
        fn = call.get("function") or {}
        if position not in self._calls:
            item = _call_item(new_id("fc"), call.get("id") or new_id("call"), fn.get("name") or "", "",
                              "in_progress")
            self._output.append(item)
            self._calls[position] = len(self._output) - 1
            out += self._event("response.output_item.added", output_index=self._calls[position], item=dict(item))
        index = self._calls[position]
        arguments = fn.get("arguments")
        if arguments:
            self._output[index]["arguments"] += arguments
            out += self._event("response.function_call_arguments.delta", item_id=self._output[index]["id"],
                               output_index=index, delta=arguments)
        return out

    def end(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        out = b"" if self._started else self._start()
        out += self._close_text()
        for index in self._calls.values():
            item = self._output[index]
            item["status"] = "completed"
            out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               arguments=item["arguments"])
            out += self._event("response.output_item.done", output_index=index, item=item)
        cut = self._finish == "length"
        final = self._echo.response(status="incomplete" if cut else "completed", output=self._output,
                                    usage=usage_of(self._usage), incomplete=cut)
        if self._done is not None:
            self._done(final)
        return out + self._event("response.incomplete" if cut else "response.completed", response=final)

    def error(self, message: str) -> bytes:
        # The stream is over once an error is sent; the `error` member makes the openai SDK raise on it.
        self._ended = True
        out = b"" if self._started else self._start()
        return out + self._event("error", code="engine_error", message=message, param=None,
                                 error={"message": message, "type": "server_error", "code": "engine_error"})


def deleted(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "deleted": True}

