"""The Ollama dialect's translation: requests to the engine's OpenAI bodies, answers and streams back to Ollama's
shapes (checked with the official SDK's own response types)."""

from __future__ import annotations

import base64
import time
from types import SimpleNamespace
from typing import Any

import ollama
import orjson
import pytest

from blazar.dialects.errors import DialectError
from blazar.dialects.ollama import (
    ChatStream,
    GenerateStream,
    chat_reply,
    chat_request,
    embed_reply,
    embed_request,
    embeddings_reply,
    embeddings_request,
    format_to_response_format,
    generate_reply,
    generate_request,
    map_options,
    parse_keep_alive,
)
from blazar.sentinels import UNSET

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\x00" * 40).decode()
TIMINGS = {"cache_n": 3, "prompt_n": 24, "prompt_ms": 96.3, "predicted_n": 80, "predicted_ms": 1493.5}
USAGE = {"completion_tokens": 80, "prompt_tokens": 27, "total_tokens": 107}


def call(load_ms: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(received=time.perf_counter() - 2.0, load_ms=load_ms)


def lines(data: bytes) -> list[dict[str, Any]]:
    assert data.endswith(b"\n")
    return [orjson.loads(line) for line in data.split(b"\n") if line]


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"finish_reason": finish, "index": 0, "delta": delta or {}}], "id": "chatcmpl-1",
            "object": "chat.completion.chunk", **extra}


def is_ns(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# --------------------------------------------------------------------------------------------- keep_alive

@pytest.mark.parametrize(("value", "expected"), [
    ("5m", 300.0), (300, 300.0), (2.5, 2.5), ("0", 0.0), (0, 0.0), (-1, None), ("-1m", None), ("1h30m", 5400.0),
    ("10s", 10.0),
])
def test_keep_alive_forms(value: Any, expected: float | None) -> None:
    assert parse_keep_alive(value) == expected


def test_keep_alive_absent_is_unset() -> None:
    assert parse_keep_alive(None) is UNSET


@pytest.mark.parametrize("value", ["5x", "", True, [5], {"m": 5}])
def test_keep_alive_bad_value_names_the_field(value: Any) -> None:
    with pytest.raises(DialectError, match="keep_alive"):
        parse_keep_alive(value)


# --------------------------------------------------------------------------------------------- options

def test_options_map_to_llama_server_fields() -> None:
    sampling, ctx = map_options({
        "temperature": 0.2, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "typical_p": 1.0, "seed": 42,
        "num_predict": 128, "stop": ["\n\n", "END"], "repeat_penalty": 1.1, "repeat_last_n": 64,
        "presence_penalty": 0.5, "frequency_penalty": 0.25, "mirostat": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
        "num_keep": 4, "tfs_z": 1.0, "num_ctx": 8192, "num_gpu": 99, "num_thread": 8, "use_mmap": True,
        "num_batch": 512, "low_vram": False, "f16_kv": True, "numa": False, "penalize_newline": True,
    })
    assert ctx == 8192
    assert sampling == {
        "temperature": 0.2, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "typical_p": 1.0, "seed": 42,
        "max_tokens": 128, "stop": ["\n\n", "END"], "repeat_penalty": 1.1, "repeat_last_n": 64,
        "presence_penalty": 0.5, "frequency_penalty": 0.25, "mirostat": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
        "n_keep": 4,
    }


@pytest.mark.parametrize("n", [-1, -2])
def test_num_predict_unlimited_means_no_max_tokens(n: int) -> None:
    assert map_options({"num_predict": n}) == ({}, None)


def test_stop_as_a_string_becomes_a_list_and_nulls_are_skipped() -> None:
    assert map_options({"stop": "###", "temperature": None}) == ({"stop": ["###"]}, None)


def test_unknown_option_is_refused() -> None:
    with pytest.raises(DialectError, match=r"^invalid option provided: xyz$"):
        map_options({"temperature": 0.1, "xyz": 1})


@pytest.mark.parametrize(("options", "field"), [
    ({"temperature": "hot"}, "options.temperature"), ({"top_k": 1.5}, "options.top_k"),
    ({"seed": True}, "options.seed"), ({"num_ctx": 0}, "options.num_ctx"), ({"num_ctx": "big"}, "options.num_ctx"),
    ({"num_predict": -3}, "options.num_predict"), ({"stop": [1]}, "options.stop"),
])
def test_option_of_the_wrong_type_names_it(options: dict[str, Any], field: str) -> None:
    with pytest.raises(DialectError, match=field):
        map_options(options)


def test_options_not_an_object() -> None:
    with pytest.raises(DialectError, match="options"):
        map_options([1])  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- format

def test_format_forms() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert format_to_response_format(None) is None
    assert format_to_response_format("") is None
    assert format_to_response_format("json") == {"type": "json_object"}
    assert format_to_response_format(schema) == {
        "type": "json_schema", "json_schema": {"name": "ollama_format", "schema": schema, "strict": True}}
    with pytest.raises(DialectError, match="format"):
        format_to_response_format("yaml")


# --------------------------------------------------------------------------------------------- /api/chat

def test_chat_request_defaults_to_streaming_with_usage() -> None:
    plan = chat_request({"model": "qwen3:0.6b", "messages": [{"role": "user", "content": "hi"}]})
    assert plan.stream is True and plan.empty is False
    assert plan.engine_path == "/v1/chat/completions"
    assert plan.engine_body == {"model": "qwen3:0.6b", "stream": True, "stream_options": {"include_usage": True},
                                "messages": [{"role": "user", "content": "hi"}]}
    assert plan.keep_alive is UNSET and plan.ctx is None and plan.max_tokens is None and plan.think is None


def test_chat_request_full_mapping() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    plan = chat_request({
        "model": "m", "stream": False, "keep_alive": "10m", "format": "json", "think": False, "tools": tools,
        "options": {"num_ctx": 4096, "num_predict": 64, "temperature": 0}, "unknown_top_level": 1,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is this?", "images": [PNG]},
            {"role": "assistant", "content": "", "thinking": "hmm",
             "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "18C", "tool_name": "get_weather"},
        ]})
    assert plan.stream is False and plan.ctx == 4096 and plan.keep_alive == 600.0 and plan.max_tokens == 64
    assert plan.think is False
    body = plan.engine_body
    assert "stream_options" not in body and "tool_choice" not in body
    assert body["response_format"] == {"type": "json_object"}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["tools"] == tools
    assert body["max_tokens"] == 64 and body["temperature"] == 0
    system, user, assistant, tool = body["messages"]
    assert system == {"role": "system", "content": "Be brief."}
    assert user["content"] == [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                               {"type": "text", "text": "What is this?"}]
    assert assistant == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_2_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]}
    assert tool == {"role": "tool", "content": "18C", "tool_call_id": "call_2_0", "name": "get_weather"}


def test_tool_results_match_their_calls() -> None:
    plan = chat_request({"model": "m", "messages": [
        {"role": "user", "content": "weather and time?"},
        {"role": "assistant", "tool_calls": [
            {"function": {"name": "weather", "arguments": {}}},
            {"function": {"name": "clock", "arguments": {}}},
            {"id": "mine", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_name": "clock", "content": "12:00"},
        {"role": "tool", "tool_call_id": "mine", "content": "3C"},
        {"role": "tool", "content": "18C"},
    ]})
    ids = [m.get("tool_call_id") for m in plan.engine_body["messages"][2:]]
    assert ids == ["call_1_1", "mine", "call_1_0"]
    assert plan.engine_body["messages"][1]["content"] == ""


def test_chat_without_messages_is_a_load_or_unload() -> None:
    assert chat_request({"model": "m"}).empty
    plan = chat_request({"model": "m", "messages": [], "keep_alive": 0})
    assert plan.empty and plan.keep_alive == 0.0


def test_think_levels() -> None:
    plan = chat_request({"model": "m", "messages": [], "think": "high"})
    assert plan.think is True
    assert plan.engine_body["chat_template_kwargs"] == {"enable_thinking": True, "reasoning_effort": "high"}


@pytest.mark.parametrize(("body", "field"), [
    ({"messages": []}, "model"),
    ({"model": "", "messages": []}, "model"),
    ({"model": "m", "messages": "hi"}, "messages"),
    ({"model": "m", "messages": ["hi"]}, "messages.0"),
    ({"model": "m", "messages": [{"role": "bot", "content": "x"}]}, "messages.0.role"),
    ({"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 5}]},
     "messages.1.content"),
    ({"model": "m", "messages": [{"role": "user", "content": "a", "images": ["%%%"]}]}, "messages.0.images.0"),
    ({"model": "m", "messages": [{"role": "user", "content": "a", "images": [base64.b64encode(b"hello").decode()]}]},
     "messages.0.images.0"),
    ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
     "messages.0.tool_calls.0.function.name"),
    ({"model": "m", "messages": [], "tools": [{"type": "function", "function": {"description": "x"}}]},
     "tools.0.function.name"),
    ({"model": "m", "messages": [], "tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"model": "m", "messages": [], "stream": "yes"}, "stream"),
    ({"model": "m", "messages": [], "think": "extreme"}, "think"),
    ({"model": "m", "messages": [], "keep_alive": "5x"}, "keep_alive"),
    ({"model": "m", "messages": [], "format": 3}, "format"),
])
def test_bad_chat_request_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(DialectError, match=field.replace(".", r"\.")):
        chat_request(body)


# --------------------------------------------------------------------------------------------- /api/generate

def test_generate_is_a_chat_turn() -> None:
    plan = generate_request({"model": "m", "prompt": "Why is the sky blue?", "system": "Be brief.", "stream": False,
                             "images": [JPEG], "think": True, "format": {"type": "object"}})
    assert plan.engine_path == "/v1/chat/completions" and not plan.empty and plan.think is True
    body = plan.engine_body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{JPEG}"}},
                                     {"type": "text", "text": "Why is the sky blue?"}]}]
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}


def test_generate_raw_goes_to_completions() -> None:
    plan = generate_request({"model": "m", "prompt": "<|im_start|>user\nhi", "raw": True, "system": "ignored",
                             "options": {"num_predict": 5}, "format": "json"})
    assert plan.engine_path == "/v1/completions"
    assert plan.engine_body == {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                                "max_tokens": 5, "prompt": "<|im_start|>user\nhi", "json_schema": {"type": "object"}}


@pytest.mark.parametrize("body", [{"model": "m"}, {"model": "m", "prompt": ""}, {"model": "m", "context": []}])
def test_generate_without_prompt_is_a_load_or_unload(body: dict[str, Any]) -> None:
    assert generate_request(body).empty


@pytest.mark.parametrize(("body", "field"), [
    ({"model": "m", "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ({"model": "m", "prompt": "x", "suffix": "end"}, "suffix"),
    ({"model": "m", "prompt": "x", "context": [1, 2, 3]}, "context"),
    ({"model": "m", "prompt": 5}, "prompt"),
    ({"model": "m", "prompt": "x", "raw": "yes"}, "raw"),
    ({"model": "m", "prompt": "x", "raw": True, "images": [PNG]}, "images"),
    ({"model": "m", "prompt": "x", "options": {"xyz": 1}}, "invalid option provided: xyz"),
])
def test_bad_generate_request_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(DialectError, match=field):
        generate_request(body)


def test_template_error_says_blazar_uses_the_models_template() -> None:
    with pytest.raises(DialectError, match="model's own chat template"):
        generate_request({"model": "m", "prompt": "x", "template": "t"})


# --------------------------------------------------------------------------------------------- whole replies

def test_chat_reply_shape() -> None:
    answer = {"choices": [{"finish_reason": "tool_calls", "index": 0, "message": {
        "role": "assistant", "content": "", "reasoning_content": "need weather",
        "tool_calls": [{"id": "call_x", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
        "usage": USAGE, "timings": TIMINGS}
    reply = chat_reply(answer, "qwen3", call(load_ms=250.0))
    ollama.ChatResponse.model_validate(reply)
    assert reply["model"] == "qwen3" and reply["done"] is True and reply["done_reason"] == "stop"
    assert reply["created_at"].endswith("Z") and "." in reply["created_at"]
    assert reply["message"]["thinking"] == "need weather"
    assert reply["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert reply["prompt_eval_count"] == 27 and reply["eval_count"] == 80
    assert reply["load_duration"] == 250_000_000
    assert reply["prompt_eval_duration"] == 96_300_000 and reply["eval_duration"] == 1_493_500_000
    assert reply["total_duration"] >= 2_000_000_000
    assert all(is_ns(reply[k]) for k in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"))


def test_chat_reply_counts_from_timings_when_usage_is_missing() -> None:
    answer = {"choices": [{"finish_reason": "length", "message": {"role": "assistant", "content": "Hello"}}],
              "timings": TIMINGS}
    reply = chat_reply(answer, "m", call())
    assert reply["done_reason"] == "length" and reply["message"] == {"role": "assistant", "content": "Hello"}
    assert reply["prompt_eval_count"] == 27 and reply["eval_count"] == 80 and reply["load_duration"] == 0


def test_chat_reply_survives_an_answer_without_choices() -> None:
    reply = chat_reply({}, "m", call())
    ollama.ChatResponse.model_validate(reply)
    assert reply["message"]["content"] == "" and reply["done_reason"] == "stop"


def test_generate_reply_from_chat_and_from_completions() -> None:
    chat = {"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "Blue.",
                                                              "reasoning_content": "Rayleigh"}}], "usage": USAGE}
    reply = generate_reply(chat, "m", call())
    ollama.GenerateResponse.model_validate(reply)
    assert reply["response"] == "Blue." and reply["thinking"] == "Rayleigh" and reply["done"] is True
    raw = {"choices": [{"text": " world", "index": 0, "finish_reason": "length"}], "usage": USAGE,
           "timings": TIMINGS}
    reply = generate_reply(raw, "m", call())
    ollama.GenerateResponse.model_validate(reply)
    assert reply["response"] == " world" and reply["done_reason"] == "length" and "thinking" not in reply


# --------------------------------------------------------------------------------------------- streams

def run(translator: Any, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = b"".join(translator.event(c) for c in chunks) + translator.end()
    return lines(out)


def test_chat_stream_text_then_final_line() -> None:
    t = ChatStream("qwen3", call(load_ms=100.0))
    assert t.content_type == "application/x-ndjson"
    got = run(t, [
        chunk({"role": "assistant", "content": None}),
        chunk({"reasoning_content": "think"}),
        chunk({"content": "Weather"}),
        chunk({"content": " is nice"}),
        chunk({}, finish="stop", timings=TIMINGS),
        {"choices": [], "usage": USAGE, "timings": TIMINGS},
    ])
    for line in got:
        ollama.ChatResponse.model_validate(line)
    assert [line["message"].get("thinking") for line in got[:1]] == ["think"]
    assert "".join(line["message"]["content"] for line in got) == "Weather is nice"
    assert all(line["done"] is False for line in got[:-1])
    last = got[-1]
    assert last["done"] is True and last["done_reason"] == "stop" and last["message"]["content"] == ""
    assert last["prompt_eval_count"] == 27 and last["eval_count"] == 80
    assert last["load_duration"] == 100_000_000 and last["eval_duration"] == 1_493_500_000
    assert all(is_ns(last[k]) for k in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"))


def test_chat_stream_tool_call_split_over_chunks_is_sent_once_whole() -> None:
    t = ChatStream("m", call())
    got = run(t, [
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"ci"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "ty\": \"Par"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "is\"}"}}]}),
        chunk({}, finish="tool_calls"),
        {"choices": [], "usage": USAGE},
    ])
    for line in got:
        ollama.ChatResponse.model_validate(line)
    with_calls = [line for line in got if line["message"].get("tool_calls")]
    assert len(with_calls) == 1
    (tc,) = with_calls[0]["message"]["tool_calls"]
    assert tc["function"]["name"] == "get_weather" and tc["function"]["arguments"] == {"city": "Paris"}
    assert got[-1]["done"] is True and got[-1]["done_reason"] == "stop"


def test_chat_stream_flushes_tool_calls_at_end_without_a_finish() -> None:
    t = ChatStream("m", call())
    first = {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}
    second = {"index": 1, "id": "b", "function": {"name": "g", "arguments": "{\"x\":1}"}}
    got = run(t, [chunk({"tool_calls": [first]}), chunk({"tool_calls": [second]})])
    assert [c["function"]["arguments"] for c in got[0]["message"]["tool_calls"]] == [{}, {"x": 1}]
    assert got[-1]["done"] is True


def test_generate_stream_from_completions_chunks() -> None:
    t = GenerateStream("m", call())
    got = run(t, [
        {"choices": [{"text": "Hello", "index": 0, "finish_reason": None}]},
        {"choices": [{"text": "", "index": 0, "finish_reason": None}]},
        {"choices": [{"text": " world", "index": 0, "finish_reason": "length"}], "timings": TIMINGS},
        {"choices": [], "usage": USAGE},
    ])
    for line in got:
        ollama.GenerateResponse.model_validate(line)
    assert [line["response"] for line in got] == ["Hello", " world", ""]
    assert got[-1]["done"] is True and got[-1]["done_reason"] == "length" and got[-1]["eval_count"] == 80


def test_generate_stream_from_chat_chunks_with_thinking() -> None:
    got = run(GenerateStream("m", call()), [chunk({"reasoning_content": "hm"}), chunk({"content": "Hi"}),
                                            chunk({}, finish="stop")])
    assert got[0]["thinking"] == "hm" and got[1]["response"] == "Hi" and got[-1]["done"] is True


def test_stream_error_is_an_ndjson_error_line() -> None:
    assert lines(ChatStream("m", call()).error("engine died")) == [{"error": "engine died"}]
    assert lines(GenerateStream("m", call()).error("x")) == [{"error": "x"}]


# --------------------------------------------------------------------------------------------- embeddings

def test_embed_request_and_reply() -> None:
    model, body, keep, truncate = embed_request({"model": "e", "input": ["a", "b"], "keep_alive": "1m",
                                                 "truncate": False, "options": {"num_ctx": 512}})
    assert (model, body, keep, truncate) == ("e", {"model": "e", "input": ["a", "b"]}, 60.0, False)
    answer = {"data": [{"embedding": [0.0, 1.0], "index": 1}, {"embedding": [1.0, 0.0], "index": 0}],
              "model": "e", "usage": {"prompt_tokens": 4, "total_tokens": 4}}
    reply = embed_reply(answer, "e", call())
    ollama.EmbedResponse.model_validate(reply)
    assert reply["embeddings"] == [[1.0, 0.0], [0.0, 1.0]] and reply["prompt_eval_count"] == 4
    assert is_ns(reply["total_duration"]) and reply["load_duration"] == 0


def test_embed_dimensions_shorten_and_renormalise() -> None:
    _, body, keep, truncate = embed_request({"model": "e", "input": "a", "dimensions": 2})
    assert body["dimensions"] == 2 and keep is UNSET and truncate is True
    reply = embed_reply({"data": [{"embedding": [3.0, 4.0, 12.0], "index": 0}]}, "e", call(), dimensions=2)
    assert reply["embeddings"] == [[0.6, 0.8]]


@pytest.mark.parametrize(("body", "field"), [
    ({"model": "e", "input": 5}, "input"), ({"model": "e", "input": ["a", 1]}, "input"),
    ({"model": "e", "input": "a", "truncate": "no"}, "truncate"),
    ({"model": "e", "input": "a", "dimensions": 0}, "dimensions"), ({"input": "a"}, "model"),
    ({"model": "e", "input": "a", "options": {"xyz": 1}}, "invalid option provided: xyz"),
])
def test_bad_embed_request_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(DialectError, match=field):
        embed_request(body)


def test_legacy_embeddings() -> None:
    model, body, keep = embeddings_request({"model": "e", "prompt": "hello", "keep_alive": -1})
    assert (model, body, keep) == ("e", {"model": "e", "input": "hello"}, None)
    reply = embeddings_reply({"data": [{"embedding": [0.1, 0.2], "index": 0}]})
    ollama.EmbeddingsResponse.model_validate(reply)
    assert reply == {"embedding": [0.1, 0.2]}
    with pytest.raises(DialectError, match="prompt"):
        embeddings_request({"model": "e", "prompt": ["x"]})


def test_a_tool_call_cut_short_is_dropped_not_sent_as_a_string() -> None:
    call = SimpleNamespace(received=time.perf_counter(), load_ms=None)
    answer = {"choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"city": "Pa'}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": '{"tz": "UTC"}'}}]}}]}
    reply = chat_reply(answer, "m", call)
    assert [c["function"]["name"] for c in reply["message"]["tool_calls"]] == ["g"]
    assert reply["done_reason"] == "length"
    ollama.ChatResponse.model_validate(reply)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", float("nan")])
def test_non_finite_keep_alive_is_refused(value: Any) -> None:
    with pytest.raises(DialectError):
        parse_keep_alive(value)


@pytest.mark.parametrize("options", [{"num_predict": 1e300}, {"seed": 2**70}, {"num_ctx": 0}, {"num_ctx": 1e12}])
def test_integers_out_of_range_are_refused(options: dict) -> None:
    with pytest.raises(DialectError):
        map_options(options)


LOGPROBS = {"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                         "top_logprobs": [{"token": "Hi", "logprob": -0.5}, {"token": "Yo", "logprob": -1.5}]}]}


def test_logprobs_are_asked_of_the_engine_and_come_back_in_ollamas_shape() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 2}
    cp = chat_request(body)
    assert (cp.engine_body["logprobs"], cp.engine_body["top_logprobs"], cp.top_logprobs) == (True, 2, 2)
    assert "logprobs" not in chat_request({**body, "logprobs": None, "top_logprobs": None}).engine_body
    assert generate_request({"model": "m", "prompt": "x", "logprobs": True}).engine_body["logprobs"] is True
    answer = {"choices": [{"message": {"content": "Hi"}, "finish_reason": "stop", "logprobs": LOGPROBS}]}
    reply = ollama.ChatResponse.model_validate(chat_reply(answer, "m", call(), 2))
    assert reply.logprobs is not None and reply.logprobs[0].token == "Hi" and reply.logprobs[0].logprob == -0.5
    assert [t.token for t in reply.logprobs[0].top_logprobs or ()] == ["Hi", "Yo"]
    # llama-server sends its own number of alternatives whatever was asked: cut to what the client asked for.
    assert [t["token"] for t in chat_reply(answer, "m", call(), 1)["logprobs"][0]["top_logprobs"]] == ["Hi"]
    assert "top_logprobs" not in chat_reply(answer, "m", call())["logprobs"][0]
    assert "logprobs" not in chat_reply({"choices": [{"message": {"content": "Hi"}}]}, "m", call())
    got = run(ChatStream("m", call(), 2), [
        {"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": LOGPROBS}]},
        chunk({}, finish="stop")])
    assert ollama.ChatResponse.model_validate(got[0]).logprobs and len(got[0]["logprobs"][0]["top_logprobs"]) == 2
    lines = run(GenerateStream("m", call()), [
        {"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": LOGPROBS}]}, chunk({}, finish="stop")])
    assert lines[0]["logprobs"][0]["bytes"] == [72, 105]


@pytest.mark.parametrize(("body", "field"), [({"logprobs": "yes"}, "logprobs"), ({"top_logprobs": 21}, "top_logprobs"),
                                             ({"top_logprobs": True}, "top_logprobs")])
def test_bad_logprobs_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(DialectError, match=rf"^{field}:"):
        chat_request({"model": "m", "messages": [], **body})
    with pytest.raises(DialectError, match=r"^logprobs: not supported with raw"):
        generate_request({"model": "m", "prompt": "x", "raw": True, "logprobs": True})
