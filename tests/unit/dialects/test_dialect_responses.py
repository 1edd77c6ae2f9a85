"""The Responses API ↔ chat translation (blazar/dialects/responses.py): request in, answer and stream out, and the
openai SDK's own models reading what comes out."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from blazar.dialects import responses as d
from blazar.dialects.errors import DialectError
from blazar.dialects.tools import ForcedStream, force

TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def test_a_string_input_becomes_one_user_message_after_the_instructions() -> None:
    asked = d.read({"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 7,
                    "temperature": 0.5, "top_p": 0.9})
    assert d.chat_messages(asked) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert asked.chat["max_tokens"] == 7 and asked.chat["temperature"] == 0.5 and asked.chat["top_p"] == 0.9
    assert asked.store is True and asked.items[0]["type"] == "message" and asked.items[0]["id"].startswith("msg_")
    assert "stream" not in asked.chat


def test_items_turn_into_chat_turns_with_calls_joined_to_their_assistant_turn() -> None:
    asked = d.read({"model": "m", "input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather"},
                                                        {"type": "input_text", "text": "in Paris?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
    ]})
    assert d.chat_messages(asked) == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather\nin Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert [i["type"] for i in asked.items] == ["message", "message", "message", "function_call",
                                                "function_call_output"]


def test_a_previous_conversation_goes_between_the_new_instructions_and_the_new_input() -> None:
    first = d.read({"model": "m", "input": "One", "instructions": "Old rules."})
    said = d.render({"choices": [{"message": {"content": "Two"}, "finish_reason": "stop"}]},
                    d.Echo("resp_1", 1, "m"))
    second = d.read({"model": "m", "input": "Three", "instructions": "New rules."})
    assert d.with_history(second, first.items + said["output"]) == [
        {"role": "system", "content": "New rules."}, {"role": "user", "content": "One"},
        {"role": "assistant", "content": "Two"}, {"role": "user", "content": "Three"}]


def test_flat_function_tools_and_a_named_tool_choice_become_a_forced_chat_call() -> None:
    asked = d.read({"model": "m", "input": "x", "tools": [TOOL],
                    "tool_choice": {"type": "function", "name": "get_weather"}})
    assert asked.chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": TOOL["parameters"]}}]
    assert asked.chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    forced = force(dict(asked.chat))
    assert forced is not None and forced.names == ["get_weather"]
    assert d.read({"model": "m", "input": "x", "tools": [TOOL], "tool_choice": "required"}).chat["tool_choice"] \
        == "required"


def test_text_format_json_schema_becomes_a_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    asked = d.read({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "out",
                                                                      "schema": schema, "strict": True}}})
    assert asked.chat["response_format"] == {"type": "json_schema",
                                             "json_schema": {"name": "out", "schema": schema, "strict": True}}
    assert asked.echo["text"]["format"]["name"] == "out"


def test_streaming_asks_the_engine_for_usage() -> None:
    asked = d.read({"model": "m", "input": "x", "stream": True})
    assert asked.chat["stream"] is True and asked.chat["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(("body", "field"), [
    ({"input": "x"}, "model"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": []}, "input"),
    ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
    ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
    ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
    ({"model": "m", "input": "x", "tools": [{"type": "shell"}]}, "tools.0.type"),
    ({"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}]},
     "tools.0.tools.0.type"),
    ({"model": "m", "input": "x", "tools": [TOOL, TOOL]}, "tools.1.name"),
    ({"model": "m", "input": "x", "tools": [TOOL, {"type": "web_search"}], "tool_choice": {"type": "web_search"}},
     "tool_choice"),
    ({"model": "m", "input": "x", "tools": [{"type": "web_search"}], "tool_choice": "required"}, "tool_choice"),
    ({"model": "m", "input": "x", "tools": [TOOL], "tool_choice": {"type": "custom", "name": "get_weather"}},
     "tool_choice.name"),
    ({"model": "m", "input": [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch"}]}, "input.0.input"),
    ({"model": "m", "input": [{"type": "local_shell_call", "call_id": "c", "action": {"command": "ls"}}]},
     "input.0.action.command"),
    ({"model": "m", "input": "x", "tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice.name"),
    ({"model": "m", "input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"model": "m", "input": "x", "tool_choice": {"type": {}, "name": ""}}, "tool_choice"),  # schemathesis found it
    ({"model": "m", "input": "x", "tools": [{"type": {}}]}, "tools.0"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "x", "temperature": "hot"}, "temperature"),
    ({"model": "m", "input": "x", "store": "yes"}, "store"),
    ({"model": "m", "input": "x", "background": True}, "background"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "schema": 5}}}, "text.format.schema"),
])
def test_bad_input_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(DialectError) as e:
        d.read(body)
    assert e.value.message.startswith(field)


def test_a_whole_answer_renders_as_a_response_the_sdk_reads() -> None:
    echo = d.Echo("resp_1", 1700000000, "gemma", d.read({"model": "m", "input": "x", "tools": [TOOL],
                                                          "metadata": {"a": "b"}}).echo)
    answer = {"choices": [{"message": {"content": "Let me see.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
        "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 3}}}
    r = Response.model_validate(d.render(answer, echo))
    assert r.id == "resp_1" and r.model == "gemma" and r.status == "completed" and r.incomplete_details is None
    assert r.output_text == "Let me see." and r.metadata == {"a": "b"} and r.tools[0].name == "get_weather"
    call = r.output[1]
    assert call.type == "function_call" and call.call_id == "call_1" and call.arguments == "{\"city\":\"Oslo\"}"
    assert r.usage is not None and (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (11, 4, 15)
    assert r.usage.input_tokens_details.cached_tokens == 3


def test_an_answer_cut_by_the_limit_is_incomplete() -> None:
    out = d.render({"choices": [{"message": {"content": "abc"}, "finish_reason": "length"}]}, d.Echo("r", 1, "m"))
    assert out["status"] == "incomplete" and out["incomplete_details"] == {"reason": "max_output_tokens"}
    assert out["output"][0]["status"] == "incomplete"


def _events(raw: bytes) -> list[Any]:
    out = []
    for block in raw.split(b"\n\n"):
        if not block:
            continue
        name, data = block.split(b"\n")
        payload = orjson.loads(data.removeprefix(b"data: "))
        assert name == b"event: " + payload["type"].encode()
        out.append(EVENTS.validate_python(payload))
    return out


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: Any = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if usage is not None:
        chunk = {"choices": [], "usage": usage}
    return chunk


def test_a_text_stream_is_the_responses_event_sequence_and_done_gets_the_final_response() -> None:
    kept: list[dict[str, Any]] = []
    s = d.ResponsesStream(d.Echo("resp_2", 1, "m"), kept.append)
    raw = b"".join([s.event(_chunk({"role": "assistant", "content": "Hel"})), s.event(_chunk({"content": "lo"})),
                    s.event(_chunk(finish="stop")), s.event(_chunk(usage={"prompt_tokens": 3, "completion_tokens": 2})),
                    s.end()])
    events = _events(raw)
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == "Hello" and final.usage.output_tokens == 2 and final.status == "completed"
    assert kept and kept[0]["output"][0]["content"][0]["text"] == "Hello"


def test_a_heartbeat_is_the_response_in_progress_and_the_sequence_numbers_run_on() -> None:
    s = d.ResponsesStream(d.Echo("resp_7", 1, "m"))
    raw = b"".join([s.heartbeat(), s.heartbeat(), s.event(_chunk({"role": "assistant", "content": "Hi"})),
                    s.event(_chunk(finish="stop")), s.end()])
    events = _events(raw)  # each parsed as the openai SDK's own event types
    assert [e.type for e in events][:4] == ["response.created", "response.in_progress", "response.in_progress",
                                            "response.output_item.added"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed" and s.heartbeat() == b""


def test_a_forced_call_streams_as_one_function_call_item() -> None:
    body = dict(d.read({"model": "m", "input": "x", "tools": [TOOL], "tool_choice": "required"}).chat)
    forced = force(body)
    assert forced is not None
    s = ForcedStream(forced, d.ResponsesStream(d.Echo("resp_3", 1, "m")))
    raw = b"".join([s.event(_chunk({"content": "{\"name\": \"get_weather\", "})),
                    s.event(_chunk({"content": "\"arguments\": {\"city\": \"Rome\"}}"})),
                    s.event(_chunk(finish="stop")), s.end()])
    events = _events(raw)
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    call = events[-1].response.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and orjson.loads(call.arguments) == {
        "city": "Rome"}


def test_a_forced_call_cut_by_the_limit_is_incomplete_with_no_half_call_whole_or_streamed() -> None:
    asked = {"model": "m", "input": "x", "tools": [TOOL], "tool_choice": "required", "max_output_tokens": 3}
    body = dict(d.read(asked).chat)
    forced = force(body)
    assert forced is not None
    cut = forced.answer({"choices": [{"message": {"content": '{"name"'}, "finish_reason": "length"}]})
    whole = Response.model_validate(d.render(cut, d.Echo("r", 1, "m")))
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output == []
    forced = force(dict(d.read(asked).chat))
    assert forced is not None
    s = ForcedStream(forced, d.ResponsesStream(d.Echo("resp_6", 1, "m")))
    raw = b"".join([s.event(_chunk({"content": '{"na'})), s.event(_chunk({"content": 'me"'})),
                    s.event(_chunk(finish="length")), s.end()])
    events = _events(raw)
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.incomplete"]
    assert events[-1].response.output == [] and events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_a_stream_cut_by_the_limit_ends_incomplete_and_a_broken_one_with_an_error_event() -> None:
    s = d.ResponsesStream(d.Echo("resp_4", 1, "m"))
    events = _events(s.event(_chunk({"content": "a"}, finish="length")) + s.end())
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    broken = d.ResponsesStream(d.Echo("resp_5", 1, "m"))
    payload = orjson.loads(broken.error("boom").split(b"\n\n")[-2].split(b"\n")[1].removeprefix(b"data: "))
    assert payload["type"] == "error" and payload["message"] == "boom" and payload["error"]["message"] == "boom"


def test_reasoning_comes_out_as_a_reasoning_item_whole_and_streamed() -> None:
    whole = Response.model_validate(d.render({"choices": [{"message": {"reasoning_content": "Think.",
                                                                       "content": "Done."},
                                                           "finish_reason": "stop"}]}, d.Echo("r", 1, "m")))
    assert [o.type for o in whole.output] == ["reasoning", "message"] and whole.output_text == "Done."
    assert whole.output[0].content[0].text == "Think."
    s = d.ResponsesStream(d.Echo("r2", 1, "m"))
    events = _events(s.event(_chunk({"reasoning_content": "Hm"})) + s.event(_chunk({"reasoning_content": "m."}))
                     + s.event(_chunk({"content": "Yes."}, finish="stop")) + s.end())
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    final = events[-1].response
    assert final.output[0].content[0].text == "Hmm." and final.output_text == "Yes."
    # Stored reasoning is not replayed to the engine as history.
    assert d.messages_of(d.render({"choices": [{"message": {"reasoning_content": "x", "content": "y"}}]},
                                  d.Echo("r3", 1, "m"))["output"]) == [{"role": "assistant", "content": "y"}]


# What Codex 0.171 (`codex exec --oss`) offers, in its shapes: functions, a namespace of functions, a freeform
# (custom) tool, the local shell, and a hosted web search; with the fields it sends beside them.
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "spawn_agent", "description": "Start one.", "strict": False,
     "parameters": {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}}]}
CODEX = {"model": "m", "input": "Say hi", "stream": True, "store": False, "tool_choice": "auto",
         "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
         "prompt_cache_key": "k", "client_metadata": {"thread_id": "t"},
         "tools": [TOOL, AGENTS, PATCH, {"type": "local_shell"}, {"type": "web_search", "external_web_access": False}]}


def test_codex_tools_are_offered_as_functions_and_hosted_ones_are_left_out() -> None:
    chat = d.read(CODEX).chat
    fns = {t["function"]["name"]: t["function"] for t in chat["tools"]}
    assert list(fns) == ["get_weather", "multi_agent_v1__spawn_agent", "apply_patch", "local_shell"]
    assert fns["multi_agent_v1__spawn_agent"]["parameters"]["required"] == ["task"]
    assert fns["apply_patch"]["parameters"] == {"type": "object", "properties": {"input": {"type": "string"}},
                                                "required": ["input"]}
    assert "Edit files." in fns["apply_patch"]["description"] and "begin_patch" in fns["apply_patch"]["description"]
    assert fns["local_shell"]["parameters"]["properties"]["command"]["type"] == "array"
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is True
    for ignored in ("reasoning", "include", "prompt_cache_key", "client_metadata", "store"):
        assert ignored not in chat
    only_hosted = d.read({**CODEX, "tools": [{"type": "web_search"}, {"type": "file_search"}]}).chat
    assert "tools" not in only_hosted and "tool_choice" not in only_hosted


def test_a_named_choice_of_a_custom_namespaced_or_shell_tool_forces_its_function() -> None:
    for choice, name in (({"type": "custom", "name": "apply_patch"}, "apply_patch"),
                         ({"type": "function", "name": "spawn_agent", "namespace": "multi_agent_v1"},
                          "multi_agent_v1__spawn_agent"),
                         ({"type": "local_shell"}, "local_shell")):
        chat = d.read({**CODEX, "tool_choice": choice}).chat
        assert chat["tool_choice"] == {"type": "function", "function": {"name": name}}


def _codex_answer(*calls: tuple[str, str]) -> dict[str, Any]:
    return {"choices": [{"message": {"content": None, "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)]}, "finish_reason": "tool_calls"}], "usage": {}}


def test_calls_render_back_as_the_items_of_the_tools_they_stand_for() -> None:
    echo = d.Echo("resp_c", 1, "m", d.read(CODEX).echo)
    r = Response.model_validate(d.render(_codex_answer(
        ("multi_agent_v1__spawn_agent", "{\"task\": \"t\"}"), ("apply_patch", "{\"input\": \"*** Begin Patch\"}"),
        ("apply_patch", "not json"), ("local_shell", "{\"command\": [\"ls\", \"-la\"], \"workdir\": \"/tmp\"}"),
        ("local_shell", "{}"), ("get_weather", "{}")), echo))
    spawn, patch, raw, shell, bad, plain = r.output
    assert spawn.type == "function_call" and (spawn.name, spawn.namespace) == ("spawn_agent", "multi_agent_v1")
    assert patch.type == "custom_tool_call" and (patch.name, patch.input) == ("apply_patch", "*** Begin Patch")
    assert raw.type == "custom_tool_call" and raw.input == "not json"
    assert shell.type == "local_shell_call" and shell.call_id == "call_3"
    assert shell.action.command == ["ls", "-la"] and shell.action.working_directory == "/tmp"
    assert bad.type == "function_call" and bad.name == "local_shell"  # no command: the client refuses it
    assert plain.type == "function_call" and plain.name == "get_weather" and plain.namespace is None
    assert [t.type for t in r.tools] == ["function", "namespace", "custom", "local_shell", "web_search"]


def test_codex_call_items_sent_back_become_the_functions_the_model_called() -> None:
    asked = d.read({**CODEX, "input": [
        {"type": "message", "role": "user", "content": "Fix it"},
        {"type": "function_call", "call_id": "a", "name": "spawn_agent", "namespace": "multi_agent_v1",
         "arguments": "{\"task\":\"t\"}"},
        {"type": "function_call_output", "call_id": "a", "output": "started"},
        {"type": "custom_tool_call", "call_id": "b", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "b", "output": "Done!"},
        {"type": "local_shell_call", "id": "ls_1", "call_id": "c", "status": "completed",
         "action": {"type": "exec", "command": ["ls"], "env": {}, "working_directory": "/w"}},
        {"type": "local_shell_call_output", "id": "c", "output": "a.txt"},
    ]})
    messages = d.chat_messages(asked)
    calls = messages[1]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["multi_agent_v1__spawn_agent"]
    assert messages[3]["tool_calls"][0]["function"] == {"name": "apply_patch",
                                                         "arguments": "{\"input\": \"*** Begin Patch\"}"}
    assert orjson.loads(messages[5]["tool_calls"][0]["function"]["arguments"]) == {"command": ["ls"],
                                                                                   "workdir": "/w"}
    assert [(m["role"], m.get("tool_call_id"), m.get("content")) for m in messages[2::2]] == [
        ("tool", "a", "started"), ("tool", "b", "Done!"), ("tool", "c", "a.txt")]
    assert [i["type"] for i in asked.items][1:] == ["function_call", "function_call_output", "custom_tool_call",
                                                   "custom_tool_call_output", "local_shell_call",
                                                   "local_shell_call_output"]


def test_a_stream_of_codex_calls_sends_custom_and_shell_calls_whole() -> None:
    s = d.ResponsesStream(d.Echo("resp_s", 1, "m", d.read(CODEX).echo))
    raw = b"".join([
        s.event(_chunk({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "apply_patch",
                                                                            "arguments": "{\"input\": "}}]})),
        s.event(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"patch\"}"}}]})),
        s.event(_chunk({"tool_calls": [{"index": 1, "id": "c1", "function": {
            "name": "multi_agent_v1__spawn_agent", "arguments": "{}"}}]})),
        s.event(_chunk({"tool_calls": [{"index": 2, "id": "c2", "function": {
            "name": "local_shell", "arguments": "{\"command\": [\"pwd\"]}"}}]})),
        s.event(_chunk(finish="tool_calls")), s.end()])
    events = _events(raw)
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.function_call_arguments.delta",  # the namespaced function, live
        "response.output_item.added", "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done", "response.output_item.done",  # apply_patch, whole
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.output_item.done",  # the shell call, whole
        "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    patch, spawn, shell = events[-1].response.output
    assert patch.type == "custom_tool_call" and patch.input == "patch" and events[6].input == "patch"
    assert spawn.type == "function_call" and spawn.namespace == "multi_agent_v1" and spawn.name == "spawn_agent"
    assert shell.type == "local_shell_call" and shell.action.command == ["pwd"]


def test_reasoning_effort_is_the_chats_and_is_echoed_a_bad_one_is_refused() -> None:
    asked = d.read({"model": "m", "input": "hi", "reasoning": {"effort": "low", "summary": "auto"}})
    assert asked.chat["reasoning_effort"] == "low"
    assert asked.echo["reasoning"] == {"effort": "low", "summary": None}
    assert "reasoning_effort" not in d.read({"model": "m", "input": "hi", "reasoning": {"summary": "auto"}}).chat
    with pytest.raises(DialectError, match=r"reasoning\.effort: expected one of none, minimal, low"):
        d.read({"model": "m", "input": "hi", "reasoning": {"effort": "huge"}})
    with pytest.raises(DialectError, match="reasoning: expected an object"):
        d.read({"model": "m", "input": "hi", "reasoning": "low"})
