"""The templates Blazar ships (blazar/store/turn_formats.py), each rendered as the engine renders its Jinja text:
every one carries the tool definitions, an assistant's tool calls and the tools' results, and ends where the model's
answer begins. (tests/integration/test_template_probe.py checks a rendering against llama-server's own.)"""

from __future__ import annotations

import json

import pytest

from blazar.errors import InvalidModelSettings
from blazar.store.model_settings import parse_template
from blazar.store.turn_formats import KNOWN, TurnFormat, by_text

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}
FORMATS = list(KNOWN.values())


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_tools_grow_the_prompt_by_their_definitions(fmt: TurnFormat) -> None:
    bare, one, two = fmt.render(ASK), fmt.render(ASK, [WEATHER]), fmt.render(ASK, [WEATHER, TIME])
    assert "<tools>" not in bare and len(bare) < len(one) < len(two)
    for tool in (WEATHER, TIME):
        assert json.dumps(tool["function"]) in two  # each definition whole, one per line
    assert len(two) - len(one) == len(json.dumps(TIME["function"])) + 1
    # Before the user's turn (in the system turn, or Gemma's first user turn), after the system text.
    assert two.index("Be brief.") < two.index("<tools>") < two.index("Weather in Paris?")
    assert two.endswith(fmt.reply) and bare.endswith(fmt.reply)


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_a_tool_call_and_its_result_render_in_later_turns(fmt: TurnFormat) -> None:
    prompt = fmt.render([*ASK, CALL, RESULT], [WEATHER])
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert prompt.count(call) == 1
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert prompt.index("Weather in Paris?") < prompt.index(call) < prompt.index("sunny, 21 C")
    assert prompt.index(fmt.model[0] + call) > 0  # the call is the assistant's turn
    # The engine may hand arguments over as an object (a template that reads them as one): the same text.
    as_object = {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "function": {  # type: ignore[index]
        "name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert fmt.render([*ASK, as_object, RESULT], [WEATHER]) == prompt
    # Two calls in one turn: one line each; text before them stays.
    two = {"role": "assistant", "content": "Checking.", "tool_calls": [
        *CALL["tool_calls"],  # type: ignore[misc]
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    rendered = fmt.render([*ASK, two], [WEATHER, TIME], add_generation_prompt=False)
    assert f"Checking.\n{call}\n" + '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>' in rendered


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_plain_turns_and_text_parts(fmt: TurnFormat) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}]}]
    assert fmt.user[0] + "Hello there" + fmt.user[1] in fmt.render(parts)  # the text parts, joined
    chat = fmt.render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                       {"role": "user", "content": "Bye"}])
    assert chat.index("Hi") < chat.index(fmt.model[0] + "Hello!" + fmt.model[1]) < chat.index("Bye")
    assert fmt.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False).endswith(fmt.user[1])
    assert fmt.stops and all(stop for stop in fmt.stops)


def test_a_shipped_template_is_set_by_name_and_known_by_its_text() -> None:
    for name, fmt in KNOWN.items():
        assert parse_template(f"blazar:{name}") == ("jinja", fmt.jinja)
        assert by_text(fmt.jinja) is fmt
    assert by_text("{{ messages }}") is None and by_text(None) is None
    with pytest.raises(InvalidModelSettings, match="blazar:chatml"):
        parse_template("blazar:nope")
