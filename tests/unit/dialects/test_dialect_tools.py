"""The forced tool choice (blazar/dialects/tools.py) and the schema checks (blazar/dialects/schema.py), by feeding
them bodies, answers and chunk sequences."""

from __future__ import annotations

import json

import orjson
import pytest

from blazar.dialects.errors import DialectError
from blazar.dialects.schema import check_response_format, check_schema, check_tools
from blazar.dialects.stream import SseEvents
from blazar.dialects.tools import ForcedStream, OpenAIStream, force

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}},
         {"type": "function", "function": {"name": "get_time"}}]


def body(choice: object, **extra: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "tool_choice": choice,
            **extra}


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_nothing_forced_leaves_the_body_alone(choice: object) -> None:
    b = body(choice)
    assert force(b) is None and b == body(choice)


def test_required_asks_for_any_tool_by_schema_and_keeps_the_tools() -> None:
    b = body("required")
    forced = force(b)
    assert forced is not None and forced.names == ["get_weather", "get_time"]
    assert b["tool_choice"] == "none" and b["tools"] == TOOLS
    schema = b["response_format"]["json_schema"]["schema"]
    assert [o["properties"]["name"] for o in schema["anyOf"]] == [{"const": "get_weather"}, {"const": "get_time"}]
    assert schema["anyOf"][0]["properties"]["arguments"] == PARAMS
    assert schema["anyOf"][1]["properties"]["arguments"] == {"type": "object"}  # a tool without parameters


def test_a_named_function_asks_for_that_one() -> None:
    b = body({"type": "function", "function": {"name": "get_weather"}})
    assert force(b).names == ["get_weather"]
    assert b["response_format"]["json_schema"]["schema"]["properties"]["name"] == {"const": "get_weather"}


@pytest.mark.parametrize(("b", "words"), [
    (body({"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name"),
    (body({"type": "bogus"}), "tool_choice"),
    (body("required", response_format={"type": "json_object"}), "response_format"),
])
def test_bad_forcing_is_a_dialect_error(b: dict, words: str) -> None:
    with pytest.raises(DialectError) as e:
        force(b)
    assert words in e.value.message and e.value.http_status == 400


def test_the_answer_becomes_a_tool_call() -> None:
    forced = force(body("required"))
    answer = {"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Paris"}}'}}]}
    choice = forced.answer(answer)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_an_answer_cut_short_stays_text() -> None:
    forced = force(body("required"))
    answer = {"choices": [{"finish_reason": "length", "message": {"content": '{"name": "get_wea'}}]}
    cut = {"finish_reason": "length", "message": {"content": '{"name": "get_wea'}}
    assert forced.answer(answer)["choices"][0] == cut


def chunks(*texts: str, finish: str = "stop") -> list[dict]:
    out = [{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}]
    out += [{"id": "c", "choices": [{"index": 0, "delta": {"content": t}}]} for t in texts]
    out.append({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                "timings": {"predicted_n": 9}})
    return out


def replay(stream: ForcedStream, items: list[dict]) -> list[dict]:
    raw = b"".join(stream.event(c) for c in items) + stream.end()
    assert raw.endswith(b"data: [DONE]\n\n")
    return SseEvents().feed(raw)


def test_a_streamed_forced_call_is_one_tool_call_delta_then_the_finish() -> None:
    forced = force(body("required"))
    got = replay(ForcedStream(forced, OpenAIStream()),
                 chunks('{"name": "get_', 'weather", "arguments": {"ci', 'ty": "Paris"}}'))
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}  # as the engine sent it
    deltas = [c["choices"][0]["delta"] for c in got[1:]]
    assert all("content" not in d for d in deltas)
    (call,) = deltas[0]["tool_calls"]
    assert call["index"] == 0 and call["function"]["name"] == "get_weather"
    assert orjson.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert got[-1]["choices"][0]["finish_reason"] == "tool_calls" and got[-1]["timings"] == {"predicted_n": 9}
    assert "timings" not in got[1]


def test_a_streamed_call_cut_short_comes_out_as_its_text() -> None:
    forced = force(body("required"))
    got = replay(ForcedStream(forced, OpenAIStream()), chunks('{"name": ', '"get_', finish="length"))
    assert got[1]["choices"][0]["delta"] == {"content": '{"name": "get_'}
    assert got[-1]["choices"][0]["finish_reason"] == "length"


def test_sse_events_survive_any_cut() -> None:
    raw = b"".join(b"data: " + orjson.dumps({"i": i}) + b"\n\n" for i in range(20)) + b"data: [DONE]\n\n"
    for size in (1, 3, 7, 64):
        events = SseEvents()
        got = [e for k in range(0, len(raw), size) for e in events.feed(raw[k:k + size])]
        assert [e["i"] for e in got] == list(range(20))


@pytest.mark.parametrize("schema", [{"type": "object", "properties": {"a": {"type": "integer"}}}, True,
                                    {"enum": ["a", "b"]}, {"$schema": "http://json-schema.org/draft-07/schema#"}])
def test_valid_schemas_pass(schema: object) -> None:
    check_schema(schema, "format")


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "object", "properties": 3}, "format.properties: invalid JSON schema"),
    ({"type": "strange"}, "format.type: invalid JSON schema"),
    ("json", "format: a JSON schema must be an object"),
])
def test_invalid_schemas_name_the_place(schema: object, words: str) -> None:
    with pytest.raises(DialectError) as e:
        check_schema(schema, "format")
    assert e.value.message.startswith(words) and e.value.code == "invalid_schema"


def test_response_format_and_tools_checks() -> None:
    check_response_format({"type": "json_object"})
    check_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": PARAMS}})
    for bad in ({"type": "yaml"}, {"type": "json_schema"}, "json"):
        with pytest.raises(DialectError):
            check_response_format(bad)
    check_tools(TOOLS)
    for bad in ([{"type": "function"}], [{"type": "function", "function": {"name": ""}}], {"x": 1},
                [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]):
        with pytest.raises(DialectError):
            check_tools(bad)
