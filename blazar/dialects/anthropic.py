"""Anthropic's Messages API ↔ the engine's OpenAI chat API: the request body going in (`to_openai`), the answer
coming out (`from_openai`), the stream's events (`MessagesStream`) and the error envelope (`error_body`).

The engine only speaks OpenAI; everything Anthropic-specific (content blocks, tool_use/tool_result turns, the
named SSE event sequence) is rebuilt here. Bad input raises `DialectError` naming the field; so does an
`anthropic-beta` feature the engine cannot honour (`check_betas`).

`cache_control` (on system, message and tool blocks) is accepted and ignored: it asks the server to cache the prompt
up to that block, and llama-server already reuses the longest cached prefix of every prompt in its slot
(`cache_prompt`), so there is nothing to mark.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeGuard

import orjson

from blazar.dialects.anthropic_body import MessagesBody
from blazar.dialects.body import checked
from blazar.dialects.errors import DialectError
from blazar.dialects.schema import check_schema
from blazar.dialects.stream import named_sse

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# NOTE: accepted and dropped: billing/routing hints and features the engine has no notion of. Unknown keys are
# ignored too, so a newer SDK sending a new optional field still works. `thinking` is read (`_thinking`).
_IGNORED = ("metadata", "service_tier", "container", "mcp_servers")
# Anthropic's rule for `thinking.budget_tokens` (its API refuses a smaller one, or one not below max_tokens).
MIN_THINKING_BUDGET = 1024

# `anthropic-beta` features, by prefix (a value is "<name>-<date>"). Refused: a feature whose point is something
# Anthropic's servers do that no local engine does (run tools, hold files or skills, reach MCP servers, a 1M-token
# window); the request would silently lose it. Every other value, known or not, is accepted and ignored: it either
# unlocks a request field handled (or refused) by itself below, or changes how Anthropic's servers bill, cache or
# stream, which the engine's answer does not depend on. Those Claude Code sends (2.1): claude-code,
# interleaved-thinking, thinking-token-count, context-management (its clear_thinking edit: earlier thinking is never
# replayed to the engine anyway), prompt-caching-scope (llama-server caches prefixes by itself),
# mid-conversation-system (system messages are merged into the leading system text: see `_messages`), effort.
REFUSED_BETAS = {
    "code-execution": "code execution runs tools on Anthropic's servers",
    "computer-use": "computer use needs Anthropic's own tool definitions",
    "mcp-client": "MCP servers are reached by Anthropic's servers",
    "files-api": "files are held by Anthropic's Files API",
    "skills": "skills run in Anthropic's containers",
    "web-fetch": "web fetch runs on Anthropic's servers",
    "web-search": "web search runs on Anthropic's servers",
    "context-1m": "the context is what the model's instance was loaded with (ask for a larger one with Ollama's "
                  "num_ctx or `blazar config set fit.ctx`), not a 1M-token window",
}
# `context_management.edits`: the types whose effect the translation already has.
_CONTEXT_EDITS_DONE = ("clear_thinking_",)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------------------- request


def to_openai(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic `POST /v1/messages` body → an OpenAI `/v1/chat/completions` body for the engine."""
    checked(MessagesBody, body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise DialectError("model: required, a non-empty string")
    max_tokens = body.get("max_tokens")
    if not _is_int(max_tokens) or max_tokens < 1:
        raise DialectError("max_tokens: required, an integer >= 1")

    system = _system(body.get("system"))
    messages, more_system = _messages(body.get("messages"))
    texts = [t for t in (system, *more_system) if t]
    # NOTE: one system message, leading. Chat templates allow a system message only first (Gemma's and Llama's
    # raise on one later), so a system message inside `messages` (Claude Code sends one at messages[1]) joins the
    # `system` field's text, in order: its words reach the model, before the turns rather than between them.
    lead = [{"role": "system", "content": "\n\n".join(texts)}] if texts else []
    out: dict[str, Any] = {"model": model, "messages": [*lead, *messages], "max_tokens": max_tokens}
    _context_management(body.get("context_management"))
    _thinking(body.get("thinking"), max_tokens, out)
    _sampling(body, out)
    _stream(body, out)

    tools = _tools(body.get("tools"))
    if tools:
        out["tools"] = tools
    _tool_choice(body.get("tool_choice"), tools, out)
    fmt = _output_format(body.get("output_config"))
    if fmt is not None:
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt}}
    return out


def _thinking(thinking: Any, max_tokens: int, out: dict[str, Any]) -> None:
    """`thinking` → the engine's budget: {type: enabled, budget_tokens: N} (N >= 1024 and below max_tokens, as
    Anthropic's API requires) is `thinking_budget_tokens` N (a model's own budget may lower it:
    blazar/serving/reasoning.py); disabled turns the template's thinking off; adaptive leaves the model to judge."""
    if thinking is None:
        return
    if not isinstance(thinking, dict):
        raise DialectError("thinking: expected an object, {\"type\": \"enabled\", \"budget_tokens\": N}, "
                           "{\"type\": \"disabled\"} or {\"type\": \"adaptive\"}")
    kind = thinking.get("type")
    if kind == "disabled":
        out["chat_template_kwargs"] = {"enable_thinking": False}
    elif kind == "enabled":
        budget = thinking.get("budget_tokens")
        if not _is_int(budget) or budget < MIN_THINKING_BUDGET:
            raise DialectError(f"thinking.budget_tokens: expected an integer >= {MIN_THINKING_BUDGET}, got "
                               f"{str(budget)[:40]}")
        if budget >= max_tokens:
            raise DialectError(f"thinking.budget_tokens: must be less than max_tokens ({budget} >= {max_tokens})")
        out["thinking_budget_tokens"] = budget
    elif kind != "adaptive":
        raise DialectError(f"thinking.type: expected \"enabled\", \"disabled\" or \"adaptive\", got "
                           f"{str(kind)[:40]!r}")


def _sampling(body: dict[str, Any], out: dict[str, Any]) -> None:
    """Copy the sampling knobs (temperature, top_p, top_k, stop_sequences → stop) into `out`, checking each."""
    for key in ("temperature", "top_p"):
        if key in body and body[key] is not None:
            if not _is_number(body[key]):
                raise DialectError(f"{key}: expected a number")
            out[key] = body[key]
    if body.get("top_k") is not None:
        if not _is_int(body["top_k"]):
            raise DialectError("top_k: expected an integer")
        out["top_k"] = body["top_k"]
    if body.get("lora") is not None:  # LoRA adapters by name: checked with the model's (blazar/serving/lora.py)
        out["lora"] = body["lora"]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise DialectError("stop_sequences: expected a list of strings")
        if stops:
            out["stop"] = stops


def _stream(body: dict[str, Any], out: dict[str, Any]) -> None:
    """Ask the engine to stream, with usage in the last chunk, when the client asked to stream."""
    stream = body.get("stream") or False  # absent or null: not streamed
    if not isinstance(stream, bool):
        raise DialectError("stream: expected a boolean")
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}


def _output_format(config: Any) -> dict[str, Any] | bool | None:
    """Structured output: `output_config.format` {type: json_schema, schema} (the schema is checked here)."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise DialectError("output_config: expected an object")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
        raise DialectError("output_config.format: expected {\"type\": \"json_schema\", \"schema\": {...}}")
    return check_schema(fmt["schema"], "output_config.format.schema")


def check_betas(header: str | None) -> None:
    """The `anthropic-beta` header (comma-separated features): a DialectError for the first one refused."""
    for value in (header or "").split(","):
        name = value.strip()
        for prefix, why in REFUSED_BETAS.items():
            if name == prefix or name.startswith(prefix + "-"):
                raise DialectError(f"anthropic-beta: {name!r} is not supported: {why}")


def _context_management(config: Any) -> None:
    """`context_management.edits`: accepted where the translation already does what the edit asks."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise DialectError("context_management: expected an object")
    edits = config.get("edits") or []
    if not isinstance(edits, list):
        raise DialectError("context_management.edits: expected a list")
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if not isinstance(kind, str) or not kind.startswith(_CONTEXT_EDITS_DONE):
            raise DialectError(f"context_management.edits.{i}.type: {kind!r} is not supported (only clear_thinking "
                               "edits: earlier thinking is never replayed to the engine)")


def _system(system: Any, where: str = "system") -> str:
    """The text of a system prompt: a string, or text blocks joined by newlines."""
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise DialectError(f"{where}: expected a string or a list of text blocks")
    texts = []
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise DialectError(f"{where}.{i}: expected a text block {{type: 'text', text: string}}")
        texts.append(block["text"])
    return "\n".join(texts)


def _messages(messages: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The turns as OpenAI messages, and the texts of the system messages among them, in order."""
    if not isinstance(messages, list) or not messages:
        raise DialectError("messages: required, a non-empty list")
    out: list[dict[str, Any]] = []
    system: list[str] = []
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise DialectError(f"{where}: expected an object with role and content")
        role = message.get("role")
        if role == "system":
            system.append(_system(message.get("content"), f"{where}.content"))
            continue
        if role not in ("user", "assistant"):
            raise DialectError(f"{where}.role: expected 'user', 'assistant' or 'system', got {role!r}")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out.extend(_user_turn(content, where) if role == "user" else [_assistant_turn(content, where)])
        else:
            raise DialectError(f"{where}.content: expected a string or a list of content blocks")
    if not out:
        raise DialectError("messages: at least one user or assistant message is required")
    return out, system


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise DialectError(f"{where}: expected a content block object with a type")
    return str(block["type"])


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise DialectError(f"{where}.text: expected a string")
    return text


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise DialectError(f"{where}.source: expected an object")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise DialectError(f"{where}.source: base64 images need media_type and data strings")
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        link = source.get("url")
        if not isinstance(link, str):
            raise DialectError(f"{where}.source.url: expected a string")
        url = link
    else:
        raise DialectError(f"{where}.source.type: {kind!r} is not supported (use 'base64' or 'url')")
    return {"type": "image_url", "image_url": {"url": url}}


def _user_turn(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic user turn → tool messages (results come first: they answer the previous assistant turn),
    then at most one user message with what remains."""
    tool_messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    has_image = False
    for j, block in enumerate(blocks):
        at = f"{where}.content.{j}"
        kind = _block_type(block, at)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, at)})
        elif kind == "image":
            parts.append(_image(block, at))
            has_image = True
        elif kind == "tool_result":
            tool_messages.append(_tool_result(block, at))
        elif kind in ("tool_use", "thinking", "redacted_thinking"):
            raise DialectError(f"{at}.type: {kind!r} blocks belong in assistant turns")
        else:
            raise DialectError(f"{at}.type: unknown or unsupported content block type {kind!r}")
    if has_image:
        return [*tool_messages, {"role": "user", "content": parts}]
    if parts or not tool_messages:
        return [*tool_messages, {"role": "user", "content": "\n".join(p["text"] for p in parts)}]
    return tool_messages


def _tool_result(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise DialectError(f"{at}.tool_use_id: required, a string")
    content = block.get("content", "")
    if content is None:
        content = ""
    if isinstance(content, list):
        texts = []
        for k, inner in enumerate(content):
            kind = _block_type(inner, f"{at}.content.{k}")
            if kind != "text":
                raise DialectError(f"{at}.content.{k}.type: only text is supported inside tool_result, got {kind!r}")
            texts.append(_text(inner, f"{at}.content.{k}"))
        content = "\n".join(texts)
    elif not isinstance(content, str):
        raise DialectError(f"{at}.content: expected a string or a list of text blocks")
    if block.get("is_error") is True:
        content = "Error: " + content
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _assistant_turn(blocks: list[Any], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content.{j}"
        kind = _block_type(block, at)
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not call_id:
                raise DialectError(f"{at}.id: required, a string")
            if not isinstance(name, str) or not name:
                raise DialectError(f"{at}.name: required, a string")
            if not isinstance(args, dict):
                raise DialectError(f"{at}.input: expected an object")
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": orjson.dumps(args).decode()}})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # NOTE: the engine re-thinks each turn; earlier reasoning is not replayed to it
        elif kind in ("tool_result", "image"):
            raise DialectError(f"{at}.type: {kind!r} blocks belong in user turns")
        else:
            raise DialectError(f"{at}.type: unknown or unsupported content block type {kind!r}")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise DialectError("tools: expected a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise DialectError(f"tools.{i}: expected an object")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise DialectError(f"tools.{i}.type: server tool {kind!r} is not supported")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise DialectError(f"tools.{i}.name: required, a string")
        if not isinstance(schema, dict):
            raise DialectError(f"tools.{i}.input_schema: required, a JSON schema object")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise DialectError(f"tools.{i}.description: expected a string")
            function["description"] = description
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, tools: list[dict[str, Any]], out: dict[str, Any]) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict):
        raise DialectError("tool_choice: expected an object with a type")
    kind = choice.get("type")
    if kind == "auto":
        mapped: Any = "auto"
    elif kind == "any":
        mapped = "required"
    elif kind == "none":
        mapped = "none"
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise DialectError("tool_choice.name: required when type is 'tool'")
        if name not in {t["function"]["name"] for t in tools}:
            raise DialectError(f"tool_choice.name: no tool named {name!r} in tools")
        mapped = {"type": "function", "function": {"name": name}}
    else:
        raise DialectError(f"tool_choice.type: expected 'auto', 'any', 'tool' or 'none', got {kind!r}")
    if kind in ("any", "tool") and not tools:
        raise DialectError(f"tool_choice: type {kind!r} needs tools")
    if tools:
        out["tool_choice"] = mapped
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise DialectError("tool_choice.disable_parallel_tool_use: expected a boolean")
    if parallel and tools:
        out["parallel_tool_calls"] = False


# ---------------------------------------------------------------------------------------------------- answer


def _usage(usage: Any, timings: Any) -> tuple[int, int, int]:
    """(input tokens not read from cache, output tokens, cached input tokens) from OpenAI usage, else timings."""
    if isinstance(usage, dict) and ("prompt_tokens" in usage or "completion_tokens" in usage):
        details = usage.get("prompt_tokens_details")
        cached = (details.get("cached_tokens") if isinstance(details, dict) else 0) or 0
        prompt = usage.get("prompt_tokens") or 0
        return max(prompt - cached, 0), usage.get("completion_tokens") or 0, cached
    if isinstance(timings, dict):
        # llama-server's prompt_n already excludes the cached prefix (that is cache_n)
        return timings.get("prompt_n") or 0, timings.get("predicted_n") or 0, timings.get("cache_n") or 0
    return 0, 0, 0


def _message_id(engine_id: Any) -> str:
    if isinstance(engine_id, str) and engine_id:
        return "msg_" + engine_id.removeprefix("chatcmpl-")
    return "msg_" + uuid.uuid4().hex


def _tool_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = orjson.loads(raw or "{}")
    except (orjson.JSONDecodeError, TypeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _stop_reason(finish: str | None, tool_calls: bool) -> str:
    """Cut off by max_tokens wins over a tool call (its input is incomplete: the real API says max_tokens too)."""
    if finish == "length":
        return "max_tokens"
    return "tool_use" if tool_calls else _STOP_REASONS.get(finish or "", "end_turn")


def from_openai(answer: dict[str, Any], model: str) -> dict[str, Any]:
    """The engine's non-stream chat completion → an Anthropic Message."""
    choices = answer.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    calls = message.get("tool_calls") or []
    for call in calls:
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or _tool_id(), "name": function.get("name", ""),
                        "input": _arguments(function.get("arguments"))})
    stop_reason = _stop_reason(choice.get("finish_reason"), bool(calls))
    input_tokens, output_tokens, cached = _usage(answer.get("usage"), answer.get("timings"))
    return {
        "id": _message_id(answer.get("id")), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0},
    }


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error envelope for an HTTP status."""
    kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


# ---------------------------------------------------------------------------------------------------- stream


class MessagesStream:
    """The engine's chat.completion.chunk stream → Anthropic's named SSE events: message_start, ping, then per
    content block start/delta.../stop, then message_delta (stop reason, usage) and message_stop at end()."""

    content_type = "text/event-stream"

    __slots__ = ("_ended", "_finish", "_index", "_model", "_open", "_saw_tool", "_started", "_timings",
                 "_tool_blocks", "_usage")

    def __init__(self, model: str) -> None:
        self._model = model
        self._started = False
        self._ended = False
        self._index = -1  # the Anthropic index of the latest block
        self._open: str | None = None  # "text", "thinking", "tool_use" while a block is open
        self._tool_blocks: dict[int, int] = {}  # OpenAI tool-call index → Anthropic block index
        self._finish: str | None = None
        self._saw_tool = False
        self._usage: Any = None
        self._timings: Any = None

    def _start(self, engine_id: Any) -> bytes:
        self._started = True
        message: dict[str, Any] = {
            "id": _message_id(engine_id), "type": "message", "role": "assistant", "model": self._model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return (named_sse("message_start", {"type": "message_start", "message": message})
                + named_sse("ping", {"type": "ping"}))

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return named_sse("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        closed = self._close()
        self._index += 1
        self._open = kind
        return closed + named_sse("content_block_start",
                                  {"type": "content_block_start", "index": self._index, "content_block": block})

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        return named_sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def event(self, chunk: dict[str, Any]) -> bytes:
        if self._ended:
            return b""
        out = b"" if self._started else self._start(chunk.get("id"))
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        if chunk.get("timings"):
            self._timings = chunk["timings"]
        choices = chunk.get("choices")
        if not choices:
            return out
        choice = choices[0]
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]
        delta = choice.get("delta")
        if not delta:
            return out
        reasoning = delta.get("reasoning_content")
        if reasoning:
            if self._open != "thinking":
                out += self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out += self._delta(self._index, {"type": "thinking_delta", "thinking": reasoning})
        text = delta.get("content")
        if text:
            if self._open != "text":
                out += self._open_block("text", {"type": "text", "text": ""})
            out += self._delta(self._index, {"type": "text_delta", "text": text})
        calls = delta.get("tool_calls")
        if calls:
            out += self._tool_deltas(calls)
        return out

    def _tool_deltas(self, calls: list[dict[str, Any]]) -> bytes:
        out = b""
        for call in calls:
            position = call.get("index", 0)
            function = call.get("function") or {}
            if position not in self._tool_blocks:
                self._saw_tool = True
                block: dict[str, Any] = {"type": "tool_use", "id": call.get("id") or _tool_id(),
                                         "name": function.get("name") or "", "input": {}}
                out += self._open_block("tool_use", block)
                self._tool_blocks[position] = self._index
            arguments = function.get("arguments")
            if arguments:
                # NOTE: fragments of an earlier call after a later one began (llama-server never interleaves) still
                # go to that call's block, so no argument text is lost.
                out += self._delta(self._tool_blocks[position], {"type": "input_json_delta", "partial_json": arguments})
        return out

    def heartbeat(self) -> bytes:
        """A ping, as Anthropic's API sends while it works (the message starts first, where it has not yet)."""
        if self._ended:
            return b""
        return self._start(None) if not self._started else named_sse("ping", {"type": "ping"})

    def end(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        out = b"" if self._started else self._start(None)
        out += self._close()
        stop_reason = _stop_reason(self._finish, self._saw_tool)
        input_tokens, output_tokens, cached = _usage(self._usage, self._timings)
        out += named_sse("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens, "input_tokens": input_tokens,
                      "cache_read_input_tokens": cached},
        })
        return out + named_sse("message_stop", {"type": "message_stop"})

    def error(self, message: str) -> bytes:
        # The stream is over once an error is sent: Anthropic's clients raise on it and read no further.
        self._ended = True
        return named_sse("error", {"type": "error", "error": {"type": "api_error", "message": message}})
