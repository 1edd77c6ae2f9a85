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
from tests.support.serving import blazar_cli

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


def test_a_forced_call_is_compact_so_it_ends_within_60_tokens(daemon: OpenAIDaemon) -> None:
    # Under the engine's own conversion of the call's schema the model padded this call's JSON with whitespace to
    # ~98 tokens and was cut at 60 (tests/integration/test_compact_grammar.py compares the two on the same seeds).
    raw = daemon.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=60, temperature=1.0, seed=5,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    chat = raw.parse()
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert chat.usage.completion_tokens < 60
    trace = raw.headers["x-blazar-trace-id"]
    daemon.wait_trace(trace, "request.completed")
    (done,) = [e for e in daemon.events("request.completed") if e["trace_id"] == trace]
    assert done["data"]["forced_call"] == "made" and done["data"]["finish_reason"] == "stop"


def test_a_forced_call_cut_by_max_tokens_is_length_with_no_text_and_why_says_so(daemon: OpenAIDaemon) -> None:
    client = daemon.client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=3, temperature=0)
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None and not choice.message.tool_calls
    trace = raw.headers["x-blazar-trace-id"]
    daemon.wait_trace(trace, "request.completed")
    why = json.loads(blazar_cli(daemon.home, "why", trace, "--json").stdout)
    assert why["outcome"] == "completed"
    assert "the forced tool call was cut at 3 tokens by max_tokens" in why["verdict"], why["verdict"]
    (done,) = [step for step in why["steps"] if step["type"] == "request.completed"]
    assert "finish: length, the forced tool call was cut at 3 tokens by max_tokens" in done["text"]
    # Streamed: no text delta, no call, the finish chunk says length.
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                            max_tokens=3, temperature=0, stream=True)
    finish = None
    for chunk in stream:
        for c in chunk.choices:
            assert not c.delta.content and not c.delta.tool_calls, c
            finish = c.finish_reason or finish
    assert finish == "length"


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
