"""The forced tool choice and structured output as the engine's grammar (blazar/dialects/tools.py) and the schema
checks (blazar/dialects/schema.py), by feeding them bodies, answers and chunk sequences."""

from __future__ import annotations

import json

import orjson
import pytest

from blazar.dialects.errors import DialectError
from blazar.dialects.grammar import any_object_grammar, schema_grammar
from blazar.dialects.schema import check_response_format, check_schema, check_tools
from blazar.dialects.stream import SseEvents
from blazar.dialects.tools import ForcedStream, OpenAIStream, compact_format, constrain, force
from tests.support.gbnf import parse

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


def test_required_asks_for_any_tool_by_a_compact_grammar_and_keeps_the_tools() -> None:
    b = body("required")
    forced = force(b)
    assert forced is not None and forced.names == ["get_weather", "get_time"]
    assert b["tool_choice"] == "none" and b["tools"] == TOOLS and "response_format" not in b
    g = parse(b["grammar"])
    assert g.accepts('{"name":"get_weather","arguments":{"city":"Paris"}}')
    assert g.accepts('{"name":"get_time","arguments":{"any":["thing"]}}')  # a tool without parameters: any object
    for text in ('{"name": "get_weather", "arguments": {"city": "Paris"}}', '{"name":"get_weather","arguments":{}}',
                 '{"name":"nope","arguments":{}}', '{"arguments":{},"name":"get_time"}'):
        assert not g.accepts(text), text


def test_a_named_function_asks_for_that_one() -> None:
    b = body({"type": "function", "function": {"name": "get_weather"}})
    assert force(b).names == ["get_weather"]
    g = parse(b["grammar"])
    assert g.accepts('{"name":"get_weather","arguments":{"city":"x"}}')
    assert not g.accepts('{"name":"get_time","arguments":{}}')


def test_parameters_the_grammar_cannot_express_go_as_the_engines_json_schema() -> None:
    ranged = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}
    b = {**body("required"), "tools": [{"type": "function", "function": {"name": "count", "parameters": ranged}}]}
    force(b)
    assert "grammar" not in b and b["tool_choice"] == "none"
    schema = b["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["name"] == {"const": "count"} and schema["properties"]["arguments"] == ranged
    assert b["response_format"]["json_schema"]["name"] == "tool_call"


def test_a_client_json_schema_field_keeps_the_forced_call_on_response_format() -> None:
    b = body("required", json_schema={"type": "object"})  # the engine refuses grammar and json_schema together
    force(b)
    assert "grammar" not in b and b["response_format"]["type"] == "json_schema"


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


def test_an_answer_cut_by_max_tokens_is_no_call_and_no_text() -> None:
    forced = force(body("required"))
    answer = {"choices": [{"finish_reason": "length", "message": {"role": "assistant", "content": '{"name":"get_wea'}}]}
    choice = forced.answer(answer)["choices"][0]
    assert choice == {"finish_reason": "length", "message": {"role": "assistant", "content": None}}
    assert forced.outcome == "cut"


def test_an_answer_cut_by_a_stop_sequence_stays_text() -> None:
    forced = force(body("required"))
    answer = {"choices": [{"finish_reason": "stop", "message": {"content": '{"name":"get_wea'}}]}
    assert forced.answer(answer)["choices"][0] == {"finish_reason": "stop", "message": {"content": '{"name":"get_wea'}}
    assert forced.outcome is None


def test_judging_a_whole_answer_says_made_or_cut_without_changing_it() -> None:
    made = {"choices": [{"finish_reason": "stop", "message": {"content": '{"name":"get_time","arguments":{}}'}}]}
    cut = {"choices": [{"finish_reason": "length", "message": {"content": '{"na'}}]}
    for answer, outcome in ((made, "made"), (cut, "cut"), (None, None), ({"choices": []}, None)):
        forced = force(body("required"))
        before = json.dumps(answer)
        assert forced.judge(answer) == outcome and forced.outcome == outcome and json.dumps(answer) == before
    forced = force(body("required"))
    forced.answer(made)
    assert forced.outcome == "made"


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


def test_a_streamed_call_cut_by_max_tokens_is_the_finish_alone() -> None:
    forced = force(body("required"))
    got = replay(ForcedStream(forced, OpenAIStream()), chunks('{"name":', '"get_', finish="length"))
    assert all("content" not in (c["choices"][0]["delta"] or {}) or c["choices"][0]["delta"]["content"] is None
               for c in got)
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in got)
    assert got[-1]["choices"][0]["finish_reason"] == "length" and got[-1]["timings"] == {"predicted_n": 9}
    assert forced.outcome == "cut"


def test_a_streamed_call_cut_by_a_stop_sequence_comes_out_as_its_text() -> None:
    forced = force(body("required"))
    got = replay(ForcedStream(forced, OpenAIStream()), chunks('{"name": ', '"get_', finish="stop"))
    assert got[1]["choices"][0]["delta"] == {"content": '{"name": "get_'}
    assert got[-1]["choices"][0]["finish_reason"] == "stop" and forced.outcome is None


def test_a_streamed_call_made_is_recorded_as_made() -> None:
    forced = force(body("required"))
    replay(ForcedStream(forced, OpenAIStream()), chunks('{"name":"get_time",', '"arguments":{}}'))
    assert forced.outcome == "made"


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_structured_output_goes_as_the_compact_grammar() -> None:
    b = {"messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
    compact_format(b)
    assert "response_format" not in b and b["grammar"] == schema_grammar(SCHEMA)
    b = {"messages": [], "response_format": {"type": "json_object"}}
    compact_format(b)
    assert "response_format" not in b and b["grammar"] == any_object_grammar()
    b = {"messages": [], "response_format": {"type": "json_object", "schema": SCHEMA}}  # llama-server's extension
    compact_format(b)
    assert b["grammar"] == schema_grammar(SCHEMA)
    b = {"messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}
    compact_format(b)
    assert b["grammar"] == any_object_grammar()  # as the engine reads an empty schema


@pytest.mark.parametrize("b", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string",
                                                                                         "pattern": "^a"}}}},
    {"response_format": {"type": "text"}},
    {"response_format": {"type": "json_object"}, "grammar": "root ::= \"x\""},
    {"response_format": {"type": "json_object"}, "json_schema": {"type": "object"}},
    {"messages": []},
])
def test_structured_output_the_grammar_cannot_take_is_left_as_it_is(b: dict) -> None:
    before = json.dumps(b)
    compact_format(b)
    assert json.dumps(b) == before


def test_constrain_forces_or_else_shapes() -> None:
    b = body("required", response_format={"type": "text"})
    assert constrain(b) is not None and "grammar" in b
    b = {"messages": [], "response_format": {"type": "json_object"}}
    assert constrain(b) is None and b["grammar"] == any_object_grammar()


@pytest.mark.parametrize("choice", [None, "auto"])
def test_structured_output_beside_tools_the_model_may_call_is_left_to_the_engine(choice: object) -> None:
    # The engine refuses a grammar beside tools unless tool_choice is "none".
    b = {"messages": [], "tools": TOOLS, "response_format": {"type": "json_object"}}
    if choice is not None:
        b["tool_choice"] = choice
    assert constrain(b) is None and "grammar" not in b and b["response_format"] == {"type": "json_object"}
    b = {"messages": [], "tools": TOOLS, "tool_choice": "none", "response_format": {"type": "json_object"}}
    assert constrain(b) is None and b["grammar"] == any_object_grammar()


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
