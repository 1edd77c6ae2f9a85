"""Tool calls and structured output through the OpenAI dialect, end to end with the `openai` SDK, the real engine and
the real Gemma (a base model: a forced call and a schema are enforced by the engine's grammar, so the protocol and
the shapes are asserted, never the words)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.support import sdk_daemons
from tests.support.sdk_daemons import MODEL, OpenAIDaemon

daemon = sdk_daemons.openai_daemon

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}}}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "color": {"enum": ["red", "blue"]}},
          "required": ["n", "color"], "additionalProperties": False}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_required_tool_choice_is_a_tool_call_and_its_result_goes_back(daemon: OpenAIDaemon) -> None:
    client = daemon.client()
    chat = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                          tool_choice="required", max_tokens=80, temperature=0)
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    schema = (WEATHER if call.function.name == "get_weather" else TIME)["function"]["parameters"]
    jsonschema.validate(args, schema)
    # The round trip: the call and its result go back, and the engine answers the next turn.
    follow = client.chat.completions.create(model=MODEL, max_tokens=8, tools=[WEATHER, TIME], messages=[
        *ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18}'}])
    assert follow.choices[0].message.role == "assistant" and follow.usage.prompt_tokens > 0


def test_a_named_tool_choice_streams_one_call_that_assembles(daemon: OpenAIDaemon) -> None:
    stream = daemon.client().chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], max_tokens=80, stream=True, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    name, args, ids, finish = "", "", set(), None
    for chunk in stream:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                assert tc.index == 0
                ids.add(tc.id) if tc.id else None
                name += tc.function.name or "" if tc.function else ""
                args += tc.function.arguments or "" if tc.function else ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and name == "get_weather" and len(ids) == 1
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])


def test_a_tool_choice_naming_no_tool_is_a_400(daemon: OpenAIDaemon) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=8,
                                                tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "tool_choice.function.name" in e.value.body["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_parses_and_matches(daemon: OpenAIDaemon, stream: bool) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}
    client = daemon.client()
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Pick"}], response_format=fmt, max_tokens=60,
            temperature=0, stream=True) if c.choices)
    else:
        text = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Pick"}],
                                              response_format=fmt, max_tokens=60, temperature=0
                                              ).choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)


def test_an_invalid_schema_is_a_400_in_openai_shape(daemon: OpenAIDaemon) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 3}}}
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().chat.completions.create(model=MODEL, messages=ASK, response_format=bad, max_tokens=8)
    assert e.value.status_code == 400
    assert e.value.body["code"] == "invalid_schema" and "response_format.json_schema.schema" in e.value.body["message"]
