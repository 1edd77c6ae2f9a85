"""The Anthropic dialect through the official `anthropic` SDK against `blazar serve` with the real llama-server and
Gemma 3 270M: messages streamed and not, token counting, errors in Anthropic's shape, one pipeline (request events
with dialect "anthropic")."""

from __future__ import annotations

import json

import anthropic
import httpx2
import jsonschema
import pytest

from tests.support import sdk_daemons
from tests.support.sdk_daemons import MODEL, OpenAIDaemon

daemon = sdk_daemons.openai_daemon  # the same module-scoped real daemon, started afresh for this module


WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                            "required": ["city"], "additionalProperties": False}}
TIME = {"name": "get_time", "description": "The time in a timezone",
        "input_schema": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(d: OpenAIDaemon) -> anthropic.Anthropic:
    # The SDK sends x-api-key and anthropic-version on every request: Blazar accepts both.
    return anthropic.Anthropic(base_url=d.base, api_key="unused", max_retries=0, timeout=120)


def test_messages_answer_with_content_and_usage(daemon: OpenAIDaemon) -> None:
    raw = client(daemon).messages.with_raw_response.create(
        model=MODEL, max_tokens=5, system="Be brief.", messages=[{"role": "user", "content": "Hello"}])
    msg = raw.parse()
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "text"
    assert msg.stop_reason in ("max_tokens", "end_turn") and msg.usage.output_tokens > 0
    trace = raw.headers["x-blazar-trace-id"]
    daemon.wait_trace(trace, "request.completed")
    received = next(e for e in daemon.events("request.received") if e["trace_id"] == trace)["data"]
    assert received["dialect"] == "anthropic" and received["route"] == "/v1/messages"


def test_messages_stream_the_full_event_sequence(daemon: OpenAIDaemon) -> None:
    with client(daemon).messages.stream(model=MODEL, max_tokens=5,
                                        messages=[{"role": "user", "content": "Count"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"]  # the SDK drops `ping` (seen on the wire below)
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) <= {"content_block_delta", "text"}  # `text` is the SDK's own helper event
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0
    assert final.stop_reason in ("max_tokens", "end_turn")
    with httpx2.stream("POST", f"{daemon.base}/v1/messages", trust_env=False, timeout=120, json={
            "model": MODEL, "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        names = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_multi_turn_with_sampling_and_stop_sequences(daemon: OpenAIDaemon) -> None:
    msg = client(daemon).messages.create(
        model=MODEL, max_tokens=6, stop_sequences=["\n\n"],
        extra_body={"temperature": 0.3, "top_p": 0.9, "top_k": 20},  # this SDK no longer names them
        system=[{"type": "text", "text": "You answer briefly."}],
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": [{"type": "text", "text": "How are you?"}]}])
    assert msg.content and msg.content[0].type == "text" and msg.usage.input_tokens > 10


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}])
def test_a_forced_tool_choice_is_a_tool_use_and_its_result_goes_back(daemon: OpenAIDaemon, choice: dict) -> None:
    c = client(daemon)
    msg = c.messages.create(model=MODEL, max_tokens=80, extra_body={"temperature": 0}, messages=ASK,
                            tools=[WEATHER, TIME], tool_choice=choice)
    assert msg.stop_reason == "tool_use"
    (use,) = [b for b in msg.content if b.type == "tool_use"]
    assert use.id and use.name in (["get_weather", "get_time"] if choice["type"] == "any" else ["get_time"])
    jsonschema.validate(use.input, (WEATHER if use.name == "get_weather" else TIME)["input_schema"])
    follow = c.messages.create(model=MODEL, max_tokens=6, tools=[WEATHER, TIME], messages=[
        *ASK, {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C, clear"}]}])
    def prompt(m: anthropic.types.Message) -> int:  # Anthropic counts the cached part of the input apart
        return m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)

    assert follow.role == "assistant" and prompt(follow) > prompt(msg)


def test_a_streamed_tool_use_assembles(daemon: OpenAIDaemon) -> None:
    with client(daemon).messages.stream(model=MODEL, max_tokens=80, extra_body={"temperature": 0}, messages=ASK,
                                        tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert any(e.type == "content_block_start" and e.content_block.type == "tool_use" for e in events)
    partial = "".join(e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and use.name == "get_weather" and json.loads(partial) == use.input
    jsonschema.validate(use.input, WEATHER["input_schema"])


def test_count_tokens(daemon: OpenAIDaemon) -> None:
    n = client(daemon).messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hello there"}])
    assert n.input_tokens > 0


def test_errors_take_anthropics_shape(daemon: OpenAIDaemon) -> None:
    with pytest.raises(anthropic.NotFoundError) as e:
        client(daemon).messages.create(model="nosuch", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    r = httpx2.post(f"{daemon.base}/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                    trust_env=False)
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]


def test_structured_output_parses_and_matches(daemon: OpenAIDaemon) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "color": {"enum": ["red", "blue"]}},
              "required": ["n", "color"], "additionalProperties": False}
    msg = client(daemon).messages.create(model=MODEL, max_tokens=60, extra_body={"temperature": 0},
                                         messages=[{"role": "user", "content": "Pick"}],
                                         output_config={"format": {"type": "json_schema", "schema": schema}})
    jsonschema.validate(json.loads(msg.content[0].text), schema)
    with pytest.raises(anthropic.BadRequestError) as e:
        client(daemon).messages.create(model=MODEL, max_tokens=5, messages=ASK, output_config={
            "format": {"type": "json_schema", "schema": {"type": "object", "properties": 3}}})
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "output_config.format.schema" in e.value.body["error"]["message"]


def test_bad_tools_are_400s_in_anthropics_shape(daemon: OpenAIDaemon) -> None:
    for body in ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
                 {"tools": [{**WEATHER, "input_schema": {"type": "object", "properties": 3}}]},
                 {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}):
        r = httpx2.post(f"{daemon.base}/v1/messages", trust_env=False, timeout=60,
                        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
                        json={"model": MODEL, "max_tokens": 5, "messages": ASK, **body})
        assert r.status_code == 400, body
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
