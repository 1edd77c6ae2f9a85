"""A realtime session's tools and function-call items: `session.update`/`response.create`'s `tools` (the Realtime
shape, flat: `{"type": "function", "name", "description", "parameters"}`) and `tool_choice` checked and turned into
the chat body's (`tools: [{"type": "function", "function": {...}}]`), the client's `function_call` and
`function_call_output` items checked, and the conversation as the chat's messages (a call an assistant message's
`tool_calls`, its output a `tool` message). A forced choice (`required`, a named function) is then enforced by the
gateway's grammar as any chat's (blazar/dialects/tools.py). Pure: no I/O."""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from blazar.dialects.errors import DialectError
from blazar.dialects.schema import check_schema
from blazar.errors import RealtimeEventInvalid, RealtimeToolHosted

ToolChoice = str | dict[str, Any]
MAX_NAME_CHARS = 64  # a function's name, as OpenAI bounds it (letters, digits, _ and -)
MAX_CALL_ID_CHARS = 128
_CHOICES = ("auto", "none", "required")


def checked_tools(tools: list[dict[str, Any]], where: str, max_tools: int) -> list[dict[str, Any]]:
    """The tools as a session shows and keeps them; RealtimeEventInvalid names the first one at fault, and
    RealtimeToolHosted refuses an MCP tool (OpenAI's servers reach the MCP server; Blazar has none)."""
    if len(tools) > max_tools:
        raise RealtimeEventInvalid(where, f"{len(tools)} tools, {max_tools} at most (inputs.realtime_max_tools)")
    kept: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        at = f"{where}.{i}"
        kind = tool.get("type", "function")
        if kind == "mcp":
            raise RealtimeToolHosted(f"{at}.type", "MCP tools are hosted only: OpenAI's servers call the MCP server. "
                                     "Offer its functions as function tools and call them from the client")
        if kind != "function":
            raise RealtimeEventInvalid(f"{at}.type", f"{kind!r}: a tool is a function (type 'function')")
        name = tool.get("name")
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            raise RealtimeEventInvalid(f"{at}.name", f"a function's name is a string of 1 to {MAX_NAME_CHARS} "
                                       "characters")
        if any(t["name"] == name for t in kept):
            raise RealtimeEventInvalid(f"{at}.name", f"{name!r} is offered twice")
        shown: dict[str, Any] = {"type": "function", "name": name}
        if tool.get("description") is not None:
            if not isinstance(tool["description"], str):
                raise RealtimeEventInvalid(f"{at}.description", "a string is expected")
            shown["description"] = tool["description"]
        parameters = tool.get("parameters") if tool.get("parameters") is not None else {"type": "object"}
        try:
            check_schema(parameters, f"{at}.parameters")
        except DialectError as e:
            raise RealtimeEventInvalid(f"{at}.parameters", str(e).split(": ", 1)[-1]) from None
        kept.append(shown | {"parameters": parameters})
    return kept


def checked_choice(choice: Any, tools: list[dict[str, Any]], where: str) -> ToolChoice:
    """`tool_choice` as the session shows and keeps it, checked against the tools it would be used with."""
    if isinstance(choice, str) and choice in _CHOICES:
        if choice == "required" and not tools:
            raise RealtimeEventInvalid(where, "'required' needs tools to call")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "mcp":
        raise RealtimeToolHosted(f"{where}.type", "MCP tools are hosted only: OpenAI's servers call the MCP server")
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if not any(t["name"] == name for t in tools):
            offered = ", ".join(t["name"] for t in tools) or "none"
            raise RealtimeEventInvalid(f"{where}.name", f"{name!r} is not one of the tools ({offered})")
        return {"type": "function", "name": name}
    raise RealtimeEventInvalid(where, "'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}")


def chat_tools(tools: list[dict[str, Any]], choice: ToolChoice) -> dict[str, Any]:
    """The chat body's `tools` and `tool_choice` (none when no tools are offered)."""
    if not tools:
        return {}
    fns = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools]
    asked: Any = choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice["name"]}}
    return {"tools": fns, "tool_choice": asked}


def function_item(item: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """A client's `function_call` or `function_call_output` item as the conversation keeps it. A call's arguments
    are a JSON object's text (the chat's template reads them); an output answers a call in the conversation."""
    if item["type"] == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            raise RealtimeEventInvalid("item.name", f"a function call names its function (1 to {MAX_NAME_CHARS} "
                                       "characters)")
        if not isinstance(arguments, str) or not isinstance(_json(arguments), dict):
            raise RealtimeEventInvalid("item.arguments", "a JSON object, as a string")
        call_id = _call_id(item.get("call_id"), required=False) or f"call_{secrets.token_hex(12)}"
        if _call(items, call_id) is not None:
            raise RealtimeEventInvalid("item.call_id", f"a call {call_id!r} is in the conversation already")
        return call_item(item["id"], call_id, name, arguments, "completed")
    answered = _call_id(item.get("call_id"), required=True)
    if answered is None or _call(items, answered) is None:
        raise RealtimeEventInvalid("item.call_id", f"no function call {answered!r} in the conversation")
    if not isinstance(item.get("output"), str):
        raise RealtimeEventInvalid("item.output", "the call's result, as a string")
    return {"id": item["id"], "object": "realtime.item", "type": "function_call_output", "status": "completed",
            "call_id": answered, "output": item["output"]}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "object": "realtime.item", "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as the chat's messages. A call joins the assistant message before it (the text it said
    first); a call whose arguments are not a JSON object (one cut short: cancelled, or at max_output_tokens) is no
    call to the model, and neither is an output without its call (deleted, or cut short)."""
    messages: list[dict[str, Any]] = []
    shown: set[str] = set()
    for item in items:
        if item["type"] == "message":
            text = "".join(p.get("text") or p.get("transcript") or "" for p in item["content"])
            if text or not any(p["type"] == "input_audio" for p in item["content"]):  # audio not heard: left out
                messages.append({"role": item["role"], "content": text})
        elif item["type"] == "function_call":
            if not isinstance(_json(item["arguments"]), dict):
                continue
            shown.add(item["call_id"])
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last["content"] or None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item["type"] == "function_call_output" and item["call_id"] in shown:
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


def _json(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _call_id(value: Any, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_CALL_ID_CHARS:
        raise RealtimeEventInvalid("item.call_id", f"a string of 1 to {MAX_CALL_ID_CHARS} characters")
    return value


def _call(items: list[dict[str, Any]], call_id: str) -> dict[str, Any] | None:
    return next((i for i in items if i["type"] == "function_call" and i["call_id"] == call_id), None)
