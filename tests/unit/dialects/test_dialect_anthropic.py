"""The Anthropic dialect: request mapping and validation, answers, stream events (also read back through the
official `anthropic` SDK over a mock transport, no network), error envelopes."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2
import orjson
import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent

from blazar.dialects.anthropic import MessagesStream, check_betas, error_body, from_openai, to_openai
from blazar.dialects.errors import DialectError
from blazar.dialects.tools import ForcedStream, force

WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "claude-local", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}], **extra}


# ---------------------------------------------------------------------------------------------------- request


def test_minimal_request_maps_to_chat_body() -> None:
    assert to_openai(body()) == {"model": "claude-local", "max_tokens": 64,
                                 "messages": [{"role": "user", "content": "Hi"}]}


def test_system_string_and_blocks_become_a_leading_system_message() -> None:
    assert to_openai(body(system="Be brief."))["messages"][0] == {"role": "system", "content": "Be brief."}
    blocks = [{"type": "text", "text": "One."}, {"type": "text", "text": "Two.", "cache_control": {"type": "x"}}]
    assert to_openai(body(system=blocks))["messages"][0] == {"role": "system", "content": "One.\nTwo."}


def test_system_messages_anywhere_join_the_system_text_in_order() -> None:
    # Claude Code 2.1's shape: system blocks (with cache_control), then a system message at messages[1].
    out = to_openai(body(system=[{"type": "text", "text": "One.", "cache_control": {"type": "ephemeral"}}],
                         messages=[{"role": "user", "content": [{"type": "text", "text": "Hi",
                                                                "cache_control": {"type": "ephemeral"}}]},
                                   {"role": "system", "content": "Two."},
                                   {"role": "assistant", "content": "Hello"},
                                   {"role": "system", "content": [{"type": "text", "text": "Three."},
                                                                  {"type": "text", "text": "Four."}]},
                                   {"role": "user", "content": "Bye"}]))
    assert out["messages"] == [{"role": "system", "content": "One.\n\nTwo.\n\nThree.\nFour."},
                               {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                               {"role": "user", "content": "Bye"}]
    only_inside = to_openai(body(messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]))
    assert only_inside["messages"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    assert to_openai(body(system=""))["messages"] == [{"role": "user", "content": "Hi"}]


def test_what_claude_code_sends_besides_is_accepted() -> None:
    out = to_openai(body(thinking={"type": "adaptive"}, output_config={"effort": "high"},
                         context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                         metadata={"user_id": "{}"},
                         tools=[{**WEATHER, "cache_control": {"type": "ephemeral"}}]))
    assert not {"thinking", "output_config", "context_management", "metadata", "response_format"} & out.keys()
    assert out["tools"][0]["function"]["name"] == "get_weather"


def test_betas_that_change_nothing_pass_and_those_the_engine_cannot_honour_are_refused() -> None:
    check_betas(None)
    check_betas("claude-code-20250219,interleaved-thinking-2025-05-14,thinking-token-count-2026-05-13,"
                "context-management-2025-06-27,prompt-caching-scope-2026-01-05,mid-conversation-system-2026-04-07,"
                "effort-2025-11-24, some-future-beta-2030-01-01")
    for refused in ("code-execution-2025-08-25", "mcp-client-2025-04-04", "files-api-2025-04-14",
                    "context-1m-2025-08-07", "computer-use-2025-01-24", "skills-2025-10-02"):
        with pytest.raises(DialectError, match=r"anthropic-beta: .* is not supported") as caught:
            check_betas(f"claude-code-20250219, {refused}")
        assert refused in str(caught.value) and caught.value.http_status == 400


def test_sampling_fields_stop_sequences_and_stream_are_copied() -> None:
    out = to_openai(body(temperature=0.2, top_p=0.9, top_k=40, stop_sequences=["END"], stream=True,
                         metadata={"user_id": "u"}, service_tier="auto"))
    assert out["temperature"] == 0.2 and out["top_p"] == 0.9 and out["top_k"] == 40
    assert out["stop"] == ["END"]
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}
    assert not {"metadata", "service_tier", "thinking", "stop_sequences"} & out.keys()


def test_thinking_enabled_is_the_engines_budget_disabled_turns_it_off_adaptive_leaves_it() -> None:
    out = to_openai(body(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 2048}))
    assert out["thinking_budget_tokens"] == 2048 and "thinking" not in out
    assert to_openai(body(thinking={"type": "disabled"}))["chat_template_kwargs"] == {"enable_thinking": False}
    adaptive = to_openai(body(thinking={"type": "adaptive"}))
    assert "thinking_budget_tokens" not in adaptive and "chat_template_kwargs" not in adaptive


@pytest.mark.parametrize(("thinking", "words"), [
    ({"type": "enabled", "budget_tokens": 1023}, "thinking.budget_tokens: expected an integer >= 1024"),
    ({"type": "enabled"}, "thinking.budget_tokens: expected an integer >= 1024"),
    ({"type": "enabled", "budget_tokens": 4096}, "thinking.budget_tokens: must be less than max_tokens"),
    ({"type": "sometimes"}, "thinking.type: expected"),
    ("on", "thinking: expected an object"),
])
def test_thinking_out_of_anthropics_rule_is_refused_naming_the_field(thinking: object, words: str) -> None:
    with pytest.raises(DialectError, match=words.replace(".", r"\.")):
        to_openai(body(max_tokens=4096, thinking=thinking))


def test_text_blocks_join_into_a_string() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert to_openai(body(messages=messages))["messages"] == [{"role": "user", "content": "a\nb"}]


def test_images_make_content_parts() -> None:
    messages = [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        {"type": "text", "text": "What is this?"},
    ]}]
    assert to_openai(body(messages=messages))["messages"] == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
        {"type": "text", "text": "What is this?"},
    ]}]


def test_tool_turns_map_to_tool_calls_and_tool_messages() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "redacted_thinking", "data": "x"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "text", "text": "Thanks"},
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
        ]},
    ]
    assert to_openai(body(messages=messages))["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
        {"role": "user", "content": "Thanks"},
    ]


def test_a_turn_of_only_tool_results_adds_no_user_message() -> None:
    messages = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]
    assert to_openai(body(messages=messages))["messages"] == [{"role": "tool", "tool_call_id": "t", "content": "ok"}]


def test_tools_and_tool_choice_map() -> None:
    out = to_openai(body(tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": True}))
    assert out["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city", "parameters": WEATHER["input_schema"]}}]
    assert out["tool_choice"] == "auto" and out["parallel_tool_calls"] is False
    assert to_openai(body(tools=[WEATHER], tool_choice={"type": "any"}))["tool_choice"] == "required"
    assert to_openai(body(tools=[WEATHER], tool_choice={"type": "none"}))["tool_choice"] == "none"
    assert to_openai(body(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}))["tool_choice"] == {
        "type": "function", "function": {"name": "get_weather"}}
    assert "parallel_tool_calls" not in to_openai(body(tools=[WEATHER], tool_choice={"type": "auto"}))


@pytest.mark.parametrize(("bad", "field"), [
    ({"model": None}, "model"),
    ({"model": 3}, "model"),
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages"),  # no turn to answer
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "system", "content": [{"type": "image"}]}]}, "messages.0.content.0"),
    ({"messages": [{"role": "system", "content": 3}, {"role": "user", "content": "a"}]}, "messages.0.content"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management.edits.0.type"),
    ({"context_management": "all"}, "context_management"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages.0.content.0.type"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "[]"}]}]}, "messages.1.content.0.input"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages.0.content.0.tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]},
     "messages.0.content.0.source.type"),
    ({"system": 3}, "system"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_k": 1.5}, "top_k"),
    ({"stop_sequences": "END"}, "stop_sequences"),
    ({"stream": "yes"}, "stream"),
    ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"tools": [{"input_schema": {}}]}, "tools.0.name"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "maybe"}}, "tool_choice.type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
])
def test_bad_input_raises_dialect_error_naming_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(DialectError) as caught:
        to_openai(body(**bad))
    assert str(caught.value).startswith(field + ":")
    assert caught.value.http_status == 400


def test_server_tools_are_not_supported() -> None:
    with pytest.raises(DialectError, match="not supported"):
        to_openai(body(tools=[{"type": "web_search_20250305", "name": "web_search"}]))


# ---------------------------------------------------------------------------------------------------- answer


def answer(message: dict[str, Any], finish: str = "stop", **extra: Any) -> dict[str, Any]:
    return {"choices": [{"finish_reason": finish, "index": 0, "message": {"role": "assistant", **message}}],
            "created": 1796277127, "model": "qwen", "object": "chat.completion", "id": "chatcmpl-abc",
            "usage": {"completion_tokens": 80, "prompt_tokens": 27, "total_tokens": 107,
                      "prompt_tokens_details": {"cached_tokens": 7}}, **extra}


def test_text_answer_becomes_a_message() -> None:
    out = from_openai(answer({"content": "Sunny."}), "claude-local")
    assert out == {"id": "msg_abc", "type": "message", "role": "assistant", "model": "claude-local",
                   "content": [{"type": "text", "text": "Sunny."}], "stop_reason": "end_turn", "stop_sequence": None,
                   "usage": {"input_tokens": 20, "output_tokens": 80, "cache_read_input_tokens": 7,
                             "cache_creation_input_tokens": 0}}
    Message.model_validate(out)


def test_reasoning_and_tool_calls_become_blocks() -> None:
    out = from_openai(answer({"content": "", "reasoning_content": "think", "tool_calls": [
        {"id": "call_x", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"type": "function", "function": {"name": "get_weather", "arguments": "{not json"}},
    ]}, finish="stop"), "m")
    assert out["content"][0] == {"type": "thinking", "thinking": "think", "signature": ""}
    assert out["content"][1] == {"type": "tool_use", "id": "call_x", "name": "get_weather", "input": {"city": "Paris"}}
    assert out["content"][2]["id"].startswith("toolu_") and out["content"][2]["input"] == {}
    assert out["stop_reason"] == "tool_use"
    Message.model_validate(out)


@pytest.mark.parametrize(("finish", "reason"), [("stop", "end_turn"), ("length", "max_tokens"),
                                                ("tool_calls", "tool_use"), ("content_filter", "end_turn")])
def test_finish_reasons_map(finish: str, reason: str) -> None:
    assert from_openai(answer({"content": "x"}, finish=finish), "m")["stop_reason"] == reason


def test_missing_usage_falls_back_to_timings_and_missing_id_gets_one() -> None:
    raw = answer({"content": "x"}, timings={"prompt_n": 12, "predicted_n": 3, "cache_n": 4})
    del raw["usage"], raw["id"]
    out = from_openai(raw, "m")
    assert out["usage"] == {"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 4,
                            "cache_creation_input_tokens": 0}
    assert out["id"].startswith("msg_") and len(out["id"]) > 10
    assert from_openai({}, "m")["usage"]["input_tokens"] == 0


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"), (503, "overloaded_error"),
    (529, "overloaded_error"), (500, "api_error"), (502, "api_error"), (422, "invalid_request_error"),
])
def test_error_body_types_by_status(status: int, kind: str) -> None:
    assert error_body(status, "nope") == {"type": "error", "error": {"type": kind, "message": "nope"}}


# ---------------------------------------------------------------------------------------------------- stream


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"finish_reason": finish, "index": 0, "delta": delta or {}}], "id": "chatcmpl-s1",
            "object": "chat.completion.chunk", "created": 1, "model": "qwen", **extra}


USAGE = {"choices": [], "id": "chatcmpl-s1", "object": "chat.completion.chunk",
         "usage": {"completion_tokens": 9, "prompt_tokens": 27, "total_tokens": 36,
                   "prompt_tokens_details": {"cached_tokens": 5}},
         "timings": {"prompt_n": 22, "predicted_n": 9, "cache_n": 5}}

TEXT_STREAM = [chunk({"role": "assistant", "content": None}), chunk({"content": "Sun"}), chunk({"content": "ny."}),
               chunk(finish="stop"), USAGE]

TOOL_STREAM = [
    chunk({"role": "assistant", "content": None}),
    chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Pa'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ris"}'}}]}),
    chunk(finish="tool_calls"), USAGE,
]


def run(chunks: list[dict[str, Any]], model: str = "claude-local") -> bytes:
    translator = MessagesStream(model)
    out = b"".join(translator.event(c) for c in chunks) + translator.end()
    assert translator.end() == b"" and translator.event(chunks[0] if chunks else chunk()) == b""
    return out


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, payload) per SSE event; the name must match the payload's type, as the SDK expects."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        name, payload = name_line.removeprefix("event: "), orjson.loads(data_line.removeprefix("data: "))
        assert payload["type"] == name
        if name not in ("ping", "error"):
            pydantic.TypeAdapter(RawMessageStreamEvent).validate_python(payload)  # the SDK's own event types
        out.append((name, payload))
    assert raw.endswith(b"\n\n")
    return out


def test_text_stream_event_sequence() -> None:
    seen = events(run(TEXT_STREAM))
    assert [name for name, _ in seen] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                          "content_block_delta", "content_block_stop", "message_delta",
                                          "message_stop"]
    start = seen[0][1]["message"]
    assert start["id"] == "msg_s1" and start["model"] == "claude-local" and start["content"] == []
    assert seen[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert [p["delta"] for _, p in seen[3:5]] == [{"type": "text_delta", "text": "Sun"},
                                                 {"type": "text_delta", "text": "ny."}]
    assert seen[6][1] == {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                          "usage": {"output_tokens": 9, "input_tokens": 22, "cache_read_input_tokens": 5}}


def test_a_heartbeat_starts_the_message_then_pings_and_the_stream_goes_on_as_usual() -> None:
    translator = MessagesStream("claude-local")
    beats = translator.heartbeat() + translator.heartbeat()  # the engine still reading the prompt
    out = beats + b"".join(translator.event(c) for c in TEXT_STREAM) + translator.end()
    seen = events(out)
    assert [name for name, _ in seen][:4] == ["message_start", "ping", "ping", "content_block_start"]
    assert [name for name, _ in seen].count("message_start") == 1 and seen[-1][0] == "message_stop"
    assert translator.heartbeat() == b""  # over: nothing after message_stop


def test_tool_call_split_over_chunks_streams_input_json() -> None:
    seen = events(run(TOOL_STREAM))
    assert [name for name, _ in seen] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                          "content_block_delta", "content_block_delta", "content_block_stop",
                                          "message_delta", "message_stop"]
    assert seen[2][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    partial = "".join(p["delta"]["partial_json"] for name, p in seen if name == "content_block_delta")
    assert orjson.loads(partial) == {"city": "Paris"}
    assert seen[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_thinking_then_text_then_tool_get_their_own_blocks() -> None:
    seen = events(run([
        chunk({"reasoning_content": "Let me"}), chunk({"reasoning_content": " think."}),
        chunk({"content": "Checking."}),
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": '{"x":1}'}}]}),
        chunk(finish="tool_calls"),
    ]))
    starts = [(p["index"], p["content_block"]["type"]) for name, p in seen if name == "content_block_start"]
    stops = [p["index"] for name, p in seen if name == "content_block_stop"]
    assert starts == [(0, "thinking"), (1, "text"), (2, "tool_use"), (3, "tool_use")]
    assert stops == [0, 1, 2, 3]
    assert seen[3][1]["delta"] == {"type": "thinking_delta", "thinking": "Let me"}


def test_usage_in_a_separate_final_chunk_reaches_message_delta() -> None:
    translator = MessagesStream("m")
    translator.event(chunk({"content": "x"}))
    translator.event(chunk(finish="length"))
    assert translator.event(USAGE) == b""  # usage alone emits nothing
    delta = next(p for name, p in events(translator.end()) if name == "message_delta")
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"] == {"output_tokens": 9, "input_tokens": 22, "cache_read_input_tokens": 5}


def test_stream_with_no_chunks_is_still_whole() -> None:
    seen = events(run([]))
    assert [name for name, _ in seen] == ["message_start", "ping", "message_delta", "message_stop"]
    assert seen[0][1]["message"]["id"].startswith("msg_")
    assert seen[2][1]["usage"]["output_tokens"] == 0


def test_error_event_and_nothing_after_it() -> None:
    translator = MessagesStream("m")
    translator.event(chunk({"content": "x"}))
    raw = translator.error("engine died")
    assert raw == (b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"engine died"}}\n\n')
    assert translator.end() == b"" and translator.event(chunk({"content": "y"})) == b""
    assert MessagesStream("m").content_type == "text/event-stream"


# ---------------------------------------------------------------------------------------------------- the SDK


def sdk(reply: httpx2.Response) -> anthropic.Anthropic:
    transport = httpx2.MockTransport(lambda request: reply)
    return anthropic.Anthropic(api_key="none", base_url="http://blazar.test", max_retries=0,
                               http_client=httpx2.Client(transport=transport))


def sse_reply(raw: bytes) -> httpx2.Response:
    return httpx2.Response(200, content=raw, headers={"content-type": "text/event-stream"})


def test_sdk_reads_a_tool_stream_into_the_final_message() -> None:
    client = sdk(sse_reply(run([chunk({"content": "Checking."}), *TOOL_STREAM[1:]])))
    with client.messages.stream(model="claude-local", max_tokens=64, messages=[{"role": "user", "content": "?"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "Checking."
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use" and final.model == "claude-local"
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.cache_read_input_tokens) == (22, 9, 5)


def test_sdk_raises_on_the_in_stream_error() -> None:
    translator = MessagesStream("m")
    client = sdk(sse_reply(translator.event(chunk({"content": "x"})) + translator.error("engine died")))
    stream = client.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "?"}])
    with pytest.raises(anthropic.APIStatusError, match="engine died"), stream as s:
        s.get_final_message()


def test_sdk_reads_the_non_stream_answer_and_error_body() -> None:
    out = from_openai(answer({"content": "Sunny."}), "claude-local")
    message = sdk(httpx2.Response(200, json=out)).messages.create(
        model="claude-local", max_tokens=8, messages=[{"role": "user", "content": "?"}])
    assert message.content[0].text == "Sunny." and message.usage.input_tokens == 20  # type: ignore[union-attr]
    with pytest.raises(anthropic.RateLimitError, match="slow down"):
        sdk(httpx2.Response(429, json=error_body(429, "slow down"))).messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "?"}])


def test_a_tool_call_cut_off_by_max_tokens_is_max_tokens_not_tool_use() -> None:
    cut = {"id": "chatcmpl-1", "choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Pa'}}]}}], "usage": {"prompt_tokens": 5,
                                                                             "completion_tokens": 9}}
    assert from_openai(cut, "m")["stop_reason"] == "max_tokens"
    stream = MessagesStream("m")
    out = stream.event({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"ci'}}]}}]})
    out += stream.event({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    out += stream.end()
    assert b'"stop_reason":"max_tokens"' in out


def test_stream_null_is_not_streamed() -> None:
    body = to_openai({"model": "m", "max_tokens": 3, "stream": None, "messages": [{"role": "user", "content": "x"}]})
    assert "stream" not in body


def forced_any() -> Any:
    body = to_openai({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "?"}],
                      "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
                      "tool_choice": {"type": "any"}})
    forced = force(body)
    assert forced is not None and "grammar" in body
    return forced


def test_a_forced_tool_call_cut_by_max_tokens_is_max_tokens_with_no_json_text() -> None:
    cut = forced_any().answer(answer({"content": '{"name'}, finish="length"))
    message = Message.model_validate(from_openai(cut, "m"))
    assert message.stop_reason == "max_tokens" and message.content == []
    streamed = ForcedStream(forced_any(), MessagesStream("m"))
    raw = streamed.event(chunk({"role": "assistant", "content": None})) + streamed.event(chunk({"content": '{"na'}))
    raw += streamed.event(chunk({"content": 'me"'})) + streamed.event(chunk(finish="length")) + streamed.end()
    got = events(raw)
    assert [name for name, _ in got] == ["message_start", "ping", "message_delta", "message_stop"]
    assert got[2][1]["delta"]["stop_reason"] == "max_tokens"
