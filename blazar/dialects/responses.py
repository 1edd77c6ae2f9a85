"""OpenAI's Responses API ↔ the engine's chat API: the request going in (`to_chat`: input items, instructions, tools,
tool_choice, text.format, sampling → a `/v1/chat/completions` body), the answer coming out (`render`: a Response
object with message and function_call items), and the stream (`ResponsesStream`: response.created ...
response.completed). Pure: ids and times come from the caller's `Echo`.

A Responses request is served as the chat request it translates to, so a forced tool choice, a model's settings,
sessions, best-of and cascades apply to it as they do to chat. The conversation a `previous_response_id` names is
the caller's to load (the content store); this module turns stored items back into chat messages (`messages_of`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from blazar.dialects.body import checked
from blazar.dialects.errors import DialectError
from blazar.dialects.responses_body import ResponsesBody
from blazar.dialects.schema import check_schema
from blazar.dialects.stream import named_sse
from blazar.events.requests import REASONING_EFFORTS as EFFORTS

# NOTE: accepted and ignored: hints with no meaning for a local engine (billing, caching, safety). Unknown keys are
# ignored too, so a newer SDK still works. `reasoning.effort` is read (`_reasoning`); its `summary` is not: the
# thinking comes back whole, as a reasoning item's text.
IGNORED = ("truncation", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
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
    checked(ResponsesBody, body)
    model = body.get("model")
    if body.get("background"):
        raise DialectError("background: responses run in the foreground here (background: true is not supported)")
    if body.get("conversation") is not None:
        raise DialectError("conversation: not supported; chain responses with previous_response_id")
    instructions, store, previous = _state(body)
    items = input_items(body.get("input"))
    chat: dict[str, Any] = {"model": model, "messages": messages_of(items)}
    tools, names = offered(body.get("tools"))
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), tools, names, chat)
    _sampling(body, chat)
    _reasoning(body.get("reasoning"), chat)
    text = _text_format(body.get("text"), chat)
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise DialectError("metadata: expected an object of strings")
    echo = {"tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "max_output_tokens": chat.get("max_tokens"), "text": text, "metadata": metadata or {}, "store": store,
            "previous_response_id": previous, "instructions": instructions,
            "reasoning": {"effort": chat.get("reasoning_effort"), "summary": None}}
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
    if body.get("lora") is not None:  # LoRA adapters by name: checked with the model's (blazar/serving/lora.py)
        chat["lora"] = body["lora"]
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise DialectError("stream: expected a boolean")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}


def _reasoning(reasoning: Any, chat: dict[str, Any]) -> None:
    """`reasoning: {effort}` → the chat body's `reasoning_effort` (blazar/serving/reasoning.py gives it a budget)."""
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise DialectError("reasoning: expected an object, {\"effort\": \"low\"}")
    effort = reasoning.get("effort")
    if effort is None:
        return
    if effort not in EFFORTS:
        raise DialectError(f"reasoning.effort: expected one of {', '.join(EFFORTS)}, got {str(effort)[:40]!r}")
    chat["reasoning_effort"] = effort


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
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            out.append(_call_input(item, kind, where))
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            # NOTE: a local_shell_call_output names its call by `id` (OpenAI's shape); the others by `call_id`
            call_id = item.get("call_id") or (item.get("id") if kind == "local_shell_call_output" else None)
            if not isinstance(call_id, str) or not call_id:
                raise DialectError(f"{where}.call_id: required, a string")
            output = item.get("output")
            if isinstance(output, list):
                output = "\n".join(_part_text(p, f"{where}.output.{j}") for j, p in enumerate(output))
            if not isinstance(output, str):
                raise DialectError(f"{where}.output: expected a string or a list of text parts")
            out.append({"id": _id_or(item, "fco"), "type": kind, "call_id": call_id, "output": output,
                        "status": "completed"})
        elif kind == "reasoning":
            continue  # NOTE: the engine re-thinks each turn; earlier reasoning is not replayed to it
        else:
            raise DialectError(f"{where}.type: {kind!r} items are not supported (message, function_call, "
                               "function_call_output, custom_tool_call(_output), local_shell_call(_output))")
    if not out:
        raise DialectError("input: no message or function call items")
    return out


def _id_or(item: dict[str, Any], prefix: str) -> str:
    given = item.get("id")
    return given if isinstance(given, str) and given else new_id(prefix)


def _call_input(item: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
    """A tool call the model made on an earlier turn, as the client sends it back: checked and kept as its item."""
    wanted = {"function_call": ("call_id", "name", "arguments"), "custom_tool_call": ("call_id", "name", "input"),
              "local_shell_call": ("call_id",)}[kind]
    for name in wanted:
        if not isinstance(item.get(name), str):
            raise DialectError(f"{where}.{name}: required, a string")
    kept = {"id": _id_or(item, "fc"), "type": kind, **{name: item[name] for name in wanted}, "status": "completed"}
    if kind == "local_shell_call":
        action = item.get("action")
        if not isinstance(action, dict) or not isinstance(action.get("command"), list) \
                or not all(isinstance(a, str) for a in action["command"]):
            raise DialectError(f"{where}.action.command: required, a list of strings")
        kept["action"] = action
    elif isinstance(item.get("namespace"), str) and item["namespace"]:
        kept["namespace"] = item["namespace"]
    return kept


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
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            call = {"id": item["call_id"], "type": "function", "function": _called(item)}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return out


def _called(item: dict[str, Any]) -> dict[str, Any]:
    """A call item → the chat function call the model made: under the name it was offered (`offered`), with the
    arguments it wrote (a custom tool's input as `{"input": ...}`, a shell call's action as the function's)."""
    kind = item["type"]
    if kind == "local_shell_call":
        action = item["action"]
        args: dict[str, Any] = {"command": action["command"]}
        if action.get("working_directory"):
            args["workdir"] = action["working_directory"]
        if action.get("timeout_ms") is not None:
            args["timeout_ms"] = action["timeout_ms"]
        return {"name": LOCAL_SHELL["name"], "arguments": json.dumps(args)}
    name = _flat(str(item["name"]), item.get("namespace"))
    if kind == "custom_tool_call":
        return {"name": name, "arguments": json.dumps({"input": item["input"]})}
    return {"name": name, "arguments": item["arguments"]}


# NOTE: tools OpenAI's own servers run (a search, a code sandbox, a remote MCP server reached from OpenAI). Offered in
# `tools` they are an offer, not a demand: the model is simply not offered them here (Codex offers `web_search` on
# every turn). Forced by `tool_choice` they are a demand Blazar cannot meet: a 400.
HOSTED = frozenset({"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11",
                    "file_search", "code_interpreter", "image_generation", "computer", "computer_use",
                    "computer_use_preview", "mcp", "tool_search"})
NAMESPACE_JOIN = "__"  # a namespace's function `f` in namespace `ns` is offered to the model as `ns__f`
# The function a `local_shell` tool is offered as: its arguments are the exec action Codex runs.
LOCAL_SHELL = {"name": "local_shell", "description": "Run a command on the local shell and read its output.",
               "parameters": {"type": "object", "required": ["command"], "properties": {
                   "command": {"type": "array", "items": {"type": "string"},
                               "description": "The command and its arguments, e.g. [\"ls\", \"-la\"]"},
                   "workdir": {"type": "string"}, "timeout_ms": {"type": "integer"}}}}
_CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


@dataclass(frozen=True)
class Offered:
    """A tool as the client named it, behind the function name the model is offered: `kind` says which output
    item a call to it becomes (function_call, custom_tool_call, local_shell_call)."""

    kind: str  # "function" | "custom" | "local_shell"
    name: str
    namespace: str | None = None


def _flat(name: str, namespace: str | None) -> str:
    return f"{namespace}{NAMESPACE_JOIN}{name}" if namespace else name


def offered(tools: Any) -> tuple[list[dict[str, Any]], dict[str, Offered]]:
    """The request's `tools` → the chat tools the model is offered, and what each offered name stands for.
    function: as is; custom (freeform): a function of one string argument `input`; namespace: its functions and
    custom tools, each named `namespace__name`; local_shell: the `local_shell` function; hosted tools: left out."""
    if tools is None:
        return [], {}
    if not isinstance(tools, list):
        raise DialectError("tools: expected a list")
    out: list[dict[str, Any]] = []
    names: dict[str, Offered] = {}

    def add(fn: dict[str, Any], what: Offered, where: str) -> None:
        if fn["name"] in names:
            raise DialectError(f"{where}.name: {fn['name']!r} is offered twice")
        names[fn["name"]] = what
        out.append({"type": "function", "function": fn})

    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise DialectError(f"{where}: expected an object")
        kind = tool.get("type")
        if isinstance(kind, str) and kind in HOSTED:  # NOTE: a type that is not a string is not hashable
            continue
        if kind == "local_shell":
            add(dict(LOCAL_SHELL), Offered("local_shell", "local_shell"), where)
        elif kind == "namespace":
            space = _name(tool, where)
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise DialectError(f"{where}.tools: expected a list of function or custom tools")
            for j, sub in enumerate(inner):
                at = f"{where}.tools.{j}"
                if not isinstance(sub, dict) or sub.get("type") not in ("function", "custom"):
                    raise DialectError(f"{at}.type: expected 'function' or 'custom' inside a namespace")
                add(_function(sub, at, space), Offered(sub["type"], sub["name"], space), at)
        elif kind in ("function", "custom"):
            add(_function(tool, where, None), Offered(kind, tool["name"]), where)
        else:
            raise DialectError(f"{where}.type: {kind!r} tools are not supported (function, custom, namespace, "
                               "local_shell; hosted tools are left out)")
    return out, names


def _name(tool: dict[str, Any], where: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise DialectError(f"{where}.name: required, a string")
    return name


def _function(tool: dict[str, Any], where: str, namespace: str | None) -> dict[str, Any]:
    """A function or custom tool as the chat function the model is offered."""
    name = _name(tool, where)
    if tool.get("type") == "custom":
        # NOTE: a freeform tool's input is text; a grammar in `format` is not enforced, only shown to the model.
        fn: dict[str, Any] = {"name": _flat(name, namespace), "parameters": _CUSTOM_PARAMETERS}
        form = tool.get("format")
        shown = [tool["description"]] if isinstance(tool.get("description"), str) else []
        if isinstance(form, dict) and form.get("type") == "grammar" and isinstance(form.get("definition"), str):
            shown.append(f"The input follows this {form.get('syntax') or ''} grammar:\n{form['definition']}")
        if shown:
            fn["description"] = "\n\n".join(shown)
        return fn
    fn = {"name": _flat(name, namespace), "parameters": tool.get("parameters") or {"type": "object"}}
    check_schema(fn["parameters"], f"{where}.parameters")
    if tool.get("description") is not None:
        if not isinstance(tool["description"], str):
            raise DialectError(f"{where}.description: expected a string")
        fn["description"] = tool["description"]
    return fn


def _tool_choice(choice: Any, tools: list[dict[str, Any]], names: dict[str, Offered], chat: dict[str, Any]) -> None:
    if choice is None:
        return
    if choice in ("auto", "none", "required"):
        mapped: Any = choice
    elif isinstance(choice, dict) and isinstance(choice.get("type"), str) and choice["type"] in HOSTED:
        raise DialectError(f"tool_choice: {choice['type']!r} is a tool OpenAI's servers run; Blazar cannot run it")
    elif isinstance(choice, dict) and choice.get("type") in ("function", "custom", "local_shell"):
        name = "local_shell" if choice["type"] == "local_shell" else choice.get("name")
        space = choice.get("namespace") if isinstance(choice.get("namespace"), str) else None
        flat = _flat(name, space) if isinstance(name, str) else None
        if flat not in names or names[flat].kind != choice["type"]:
            offers = ", ".join(f"{o.kind} {_flat(o.name, o.namespace)}" for o in names.values())
            raise DialectError(f"tool_choice.name: {name!r} is not one of the {choice['type']} tools ({offers})")
        mapped = {"type": "function", "function": {"name": flat}}
    else:
        raise DialectError("tool_choice: expected 'auto', 'none', 'required' or {\"type\": \"function\", "
                           "\"name\": ...}")
    if mapped not in ("auto", "none") and not tools:
        raise DialectError("tool_choice: forcing a tool call needs tools Blazar can offer the model "
                           "(hosted tools are not)")
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
            "reasoning": f.get("reasoning") or {"effort": None, "summary": None}, "store": f.get("store", True),
            "temperature": f.get("temperature"), "text": f.get("text") or {"format": {"type": "text"}},
            "tool_choice": f.get("tool_choice", "auto"), "tools": f.get("tools", []), "top_p": f.get("top_p"),
            "truncation": "disabled", "usage": usage, "user": None, "metadata": f.get("metadata") or {},
        }

    def names(self) -> dict[str, Offered]:
        """What each function name the model was offered stands for (the request's tools, read by `offered`)."""
        return offered(self.fields.get("tools"))[1]


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


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str,
               names: dict[str, Offered]) -> dict[str, Any]:
    """The model's call of an offered function → the output item of the tool it stands for: a `function_call`
    (with its `namespace` when it came from one), a `custom_tool_call` whose `input` is the `input` argument (or,
    when the model wrote something else, its arguments as written), or a `local_shell_call` whose exec action is the
    arguments (a shell call with no list of strings as its command stays a function_call the client can refuse)."""
    what = names.get(name) or Offered("function", name)
    space = {"namespace": what.namespace} if what.namespace else {}
    if what.kind == "custom":
        args = _json_object(arguments)
        text = args["input"] if isinstance(args.get("input"), str) else arguments
        return {"id": item_id, "type": "custom_tool_call", "call_id": call_id, "name": what.name, "input": text,
                "status": status, **space}
    if what.kind == "local_shell":
        args = _json_object(arguments)
        command = args.get("command")
        if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
            action: dict[str, Any] = {"type": "exec", "command": command, "env": {}, "user": None,
                      "timeout_ms": args["timeout_ms"] if isinstance(args.get("timeout_ms"), int) else None,
                      "working_directory": args["workdir"] if isinstance(args.get("workdir"), str) else None}
            return {"id": item_id, "type": "local_shell_call", "call_id": call_id, "action": action,
                    "status": status}
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": what.name, "arguments": arguments,
            "status": status, **space}


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


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
    names = echo.names()
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        output.append(_call_item(new_id("fc"), call.get("id") or new_id("call"), fn.get("name") or "",
                                 fn.get("arguments") or "{}", "completed", names))
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
        self._names = echo.names()
        # NOTE: a call to a custom or shell tool is sent whole at the end (its item is only known from all of
        # its arguments); a function call streams its arguments as they come.
        self._whole: dict[int, tuple[str, str, list[str]]] = {}  # output index → (call id, name, arguments)
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
            call_id, name = call.get("id") or new_id("call"), fn.get("name") or ""
            item = _call_item(new_id("fc"), call_id, name, "", "in_progress", self._names)
            self._output.append(item)
            index = self._calls[position] = len(self._output) - 1
            if name in self._names and self._names[name].kind != "function":
                self._whole[index] = (call_id, name, [])
            else:
                out += self._event("response.output_item.added", output_index=index, item=dict(item))
        index = self._calls[position]
        arguments = fn.get("arguments")
        if arguments and index in self._whole:
            self._whole[index][2].append(arguments)
        elif arguments:
            self._output[index]["arguments"] += arguments
            out += self._event("response.function_call_arguments.delta", item_id=self._output[index]["id"],
                               output_index=index, delta=arguments)
        return out

    def _call_done(self, index: int) -> bytes:
        item = self._output[index]
        if index not in self._whole:
            item["status"] = "completed"
            return (self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                arguments=item["arguments"])
                    + self._event("response.output_item.done", output_index=index, item=item))
        call_id, name, parts = self._whole[index]
        item = self._output[index] = _call_item(item["id"], call_id, name, "".join(parts), "completed",
                                                self._names)
        out = self._event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"})
        if item["type"] == "custom_tool_call":
            out += self._event("response.custom_tool_call_input.delta", item_id=item["id"], output_index=index,
                               delta=item["input"])
            out += self._event("response.custom_tool_call_input.done", item_id=item["id"], output_index=index,
                               input=item["input"])
        elif item["type"] == "function_call":  # a shell call the model wrote no command for
            out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               arguments=item["arguments"])
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def heartbeat(self) -> bytes:
        """The response is still in progress: response.created first where it has not gone out yet, then
        response.in_progress again (the API has no ping event; a client's idle timer counts events, not comments)."""
        if self._ended:
            return b""
        if not self._started:
            return self._start()
        return self._event("response.in_progress", response=self._echo.response(status="in_progress", output=[],
                                                                                 usage=None))

    def end(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        out = b"" if self._started else self._start()
        out += self._close_text()
        for index in self._calls.values():
            out += self._call_done(index)
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

