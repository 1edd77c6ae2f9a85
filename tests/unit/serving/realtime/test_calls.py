"""Function calls in a realtime session, against a fake chat port: the tools checked, shown and asked as the chat's,
the chat's tool-call pieces streamed as function-call items (in order, their arguments assembled), and the
conversation's calls and results handed back to the chat as `tool_calls` and `tool` messages."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from blazar.serving.realtime.port import ToolCallDelta, Usage
from tests.unit.serving.realtime.test_session import Client, FakeChat, user

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}


def call(index: int, call_id: str | None, name: str | None, arguments: str) -> ToolCallDelta:
    return ToolCallDelta(index, call_id, name, arguments)


async def test_a_call_streams_as_a_function_call_item_whose_arguments_assemble() -> None:
    chat = FakeChat([call(0, "call_1", "get_weather", ""), call(0, None, None, '{"city":'),
                     call(0, None, None, '"Paris"}'), Usage(9, 7)])
    c = Client(chat)
    await c.say(type="session.update", session={"tools": [WEATHER], "tool_choice": "required"})
    assert c.seen[-1]["type"] == "session.updated"
    assert c.seen[-1]["session"]["tools"] == [WEATHER] and c.seen[-1]["session"]["tool_choice"] == "required"
    await c.say(type="conversation.item.create", item=user("Weather in Paris?", id="item_q"))
    out = await c.say(type="response.create")
    assert c.types(out) == ["response.created", "response.output_item.added", "conversation.item.added",
                            "response.function_call_arguments.delta", "response.function_call_arguments.delta",
                            "response.function_call_arguments.done", "response.output_item.done",
                            "conversation.item.done", "response.done"]
    added, args_done, item_done = out[1], out[5], out[6]
    assert added["output_index"] == 0 and added["item"] == {**added["item"], "type": "function_call",
                                                           "call_id": "call_1", "name": "get_weather",
                                                           "arguments": "", "status": "in_progress"}
    assert out[2]["previous_item_id"] == "item_q"
    assert args_done == {**args_done, "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}',
                         "item_id": added["item"]["id"], "output_index": 0}
    assert item_done["item"]["status"] == "completed" and item_done["item"]["arguments"] == '{"city":"Paris"}'
    done = out[-1]["response"]
    assert done["status"] == "completed" and done["output"] == [item_done["item"]]
    assert done["usage"]["total_tokens"] == 16
    assert c.session.items[-1] == item_done["item"]
    body = chat.bodies[0]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER["parameters"]}}]
    assert body["tool_choice"] == "required"


async def test_text_then_two_calls_each_get_an_output_index_and_go_back_to_the_chat_with_their_results() -> None:
    chat = FakeChat(["Let me check.", call(0, "c1", "get_weather", '{"city":"Oslo"}'),
                     call(1, "c2", "get_time", "{}"), Usage(3, 3)])
    c = Client(chat, max_items=16)
    await c.say(type="session.update", session={"tools": [WEATHER, TIME]})
    await c.say(type="conversation.item.create", item=user("Weather and time?"))
    out = await c.say(type="response.create")
    opened = [(e["output_index"], e["item"]["type"]) for e in out if e["type"] == "response.output_item.added"]
    assert opened == [(0, "message"), (1, "function_call"), (2, "function_call")]
    assert [e["output_index"] for e in out if e["type"] == "response.function_call_arguments.done"] == [1, 2]
    assert [i["type"] for i in out[-1]["response"]["output"]] == ["message", "function_call", "function_call"]
    for call_id, result in (("c1", '{"temperature_c": 4}'), ("c2", "12:00")):
        made = await c.say(type="conversation.item.create",
                           item={"type": "function_call_output", "call_id": call_id, "output": result})
        assert c.types(made) == ["conversation.item.added", "conversation.item.done"]
        assert made[1]["item"] == {**made[1]["item"], "type": "function_call_output", "call_id": call_id}
    chat.pieces = ["It is 4 degrees.", Usage(1, 1)]
    await c.say(type="response.create", response={"tool_choice": "none"})
    assert chat.bodies[1]["messages"] == [
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temperature_c": 4}'},
        {"role": "tool", "tool_call_id": "c2", "content": "12:00"}]
    assert chat.bodies[1]["tool_choice"] == "none" and len(chat.bodies[1]["tools"]) == 2


async def test_the_clients_own_call_and_its_output_are_history_for_the_chat() -> None:
    chat = FakeChat(["ok", Usage(1, 1)])
    c = Client(chat)
    fc = {"type": "function_call", "call_id": "call_x", "name": "get_time", "arguments": '{"tz": "UTC"}'}
    made = await c.say(type="conversation.item.create", item=fc)
    assert made[-1]["item"] == {**made[-1]["item"], **fc, "status": "completed", "object": "realtime.item"}
    for bad, param in (({**fc, "arguments": "not json"}, "item.arguments"),
                       ({**fc, "arguments": "[1]"}, "item.arguments"),
                       ({**fc, "name": ""}, "item.name"),
                       (fc, "item.call_id"),  # the same call twice
                       ({"type": "function_call_output", "call_id": "call_other", "output": "x"}, "item.call_id"),
                       ({"type": "function_call_output", "call_id": "call_x"}, "item.output")):
        refused = await c.say(type="conversation.item.create", item=bad, event_id="e_bad")
        assert refused[0]["error"] == {**refused[0]["error"], "code": "invalid_value", "param": param,
                                       "event_id": "e_bad"}, (bad, refused)
    await c.say(type="conversation.item.create", item={"type": "function_call_output", "call_id": "call_x",
                                                       "output": "09:00"})
    await c.say(type="response.create")
    assert chat.bodies[0]["messages"] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_x", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "call_x", "content": "09:00"}]
    assert "tools" not in chat.bodies[0]  # history alone offers no tools
    # A deleted call takes its output out of the chat's view too.
    await c.say(type="conversation.item.delete", item_id=made[-1]["item"]["id"])
    await c.say(type="response.create")
    assert [m["role"] for m in chat.bodies[1]["messages"]] == ["assistant"]


@pytest.mark.parametrize(("session", "code", "param"), [
    ({"tools": [WEATHER, TIME, {**TIME, "name": "t3"}]}, "invalid_value", "session.tools"),
    ({"tools": [WEATHER, WEATHER]}, "invalid_value", "session.tools.1.name"),
    ({"tools": [{**WEATHER, "parameters": {"type": "nonsense"}}]}, "invalid_value", "session.tools.0.parameters"),
    ({"tools": [{"type": "file_search"}]}, "invalid_value", "session.tools.0.type"),
    ({"tools": [{"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.deepwiki.com/mcp"}]},
     "hosted_tool_not_supported", "session.tools.0.type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_time"}}, "invalid_value",
     "session.tool_choice.name"),
    ({"tool_choice": "required"}, "invalid_value", "session.tool_choice"),
    ({"tool_choice": "sometimes"}, "invalid_value", "session.tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "mcp", "server_label": "x"}}, "hosted_tool_not_supported",
     "session.tool_choice.type"),
])
async def test_bad_tools_are_refused_by_name_and_change_nothing(session: dict[str, Any], code: str,
                                                                param: str) -> None:
    c = Client(FakeChat(["ok"]))
    c.session.bounds = type(c.session.bounds)(8, 64, max_tools=2)
    out = await c.say(type="session.update", session={"instructions": "changed", **session}, event_id="e1")
    assert c.types(out) == ["error"]
    assert out[0]["error"] == {**out[0]["error"], "code": code, "param": param, "event_id": "e1"}, out[0]
    assert (c.session.tools, c.session.tool_choice, c.session.instructions) == ([], "auto", "")


async def test_a_response_offers_its_own_tools_and_choice_and_out_of_band_keeps_the_call_out() -> None:
    chat = FakeChat([call(0, "c9", "get_time", "{}"), Usage(1, 1)])
    c = Client(chat)
    await c.say(type="session.update", session={"tools": [WEATHER]})
    out = await c.say(type="response.create", response={
        "tools": [TIME], "tool_choice": {"type": "function", "name": "get_time"}, "conversation": "none"})
    assert chat.bodies[0]["tools"][0]["function"]["name"] == "get_time"
    assert chat.bodies[0]["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert "conversation.item.added" not in c.types(out) and "conversation.item.done" not in c.types(out)
    assert out[-1]["response"]["output"][0]["call_id"] == "c9" and c.session.items == []
    assert c.session.tools == [WEATHER]  # the session's own are unchanged
    refused = await c.say(type="response.create", response={"tool_choice": {"type": "function", "name": "nope"}})
    assert refused[0]["error"]["param"] == "response.tool_choice.name" and len(chat.bodies) == 1


async def test_a_cancelled_call_ends_incomplete_and_is_no_call_to_the_chat() -> None:
    hold = asyncio.Event()
    chat = FakeChat([call(0, "c1", "get_weather", '{"ci'), call(0, None, None, 'ty":"Rome"}')], hold=hold)
    c = Client(chat)
    await c.say(type="session.update", session={"tools": [WEATHER], "tool_choice": "required"})
    await c.session.receive(orjson.dumps({"type": "response.create"}))
    for _ in range(100):  # bounded: the first piece arrives after a few loop turns
        if any(e["type"] == "response.function_call_arguments.delta" for e in c.seen):
            break
        await asyncio.sleep(0)
    out = await c.say(type="response.cancel")
    assert c.types(out) == ["response.function_call_arguments.done", "response.output_item.done",
                            "conversation.item.done", "response.done"]
    assert out[0]["arguments"] == '{"ci' and out[-1]["response"]["status"] == "cancelled"
    assert out[-1]["response"]["output"][0]["status"] == "incomplete"
    await c.say(type="conversation.item.create", item={"type": "function_call_output", "call_id": "c1",
                                                       "output": "sunny"})
    chat.hold, chat.pieces = None, ["ok"]
    await c.say(type="response.create", response={"tool_choice": "auto"})
    assert chat.bodies[1]["messages"] == []  # half a call's arguments are no call, and its output answers none


async def test_text_after_a_call_takes_the_next_output_index_and_follows_it_in_the_conversation() -> None:
    chat = FakeChat([call(0, "c1", None, ""), call(0, None, "get_time", "{}"), "Done.", Usage(1, 1)])
    c = Client(chat)
    await c.say(type="session.update", session={"tools": [TIME]})
    out = await c.say(type="response.create")
    added = [e for e in out if e["type"] == "conversation.item.added"]
    assert [(e["item"]["type"], e["previous_item_id"]) for e in added] == [
        ("function_call", None), ("message", added[0]["item"]["id"])]
    assert [e["output_index"] for e in out if e["type"] == "response.output_item.added"] == [0, 1]
    assert [e["output_index"] for e in out if e["type"] == "response.output_text.delta"] == [1]
    done = out[-1]["response"]["output"]
    assert [(i["type"], i.get("name")) for i in done] == [("function_call", "get_time"), ("message", None)]
    assert [i["type"] for i in c.session.items] == ["function_call", "message"]
