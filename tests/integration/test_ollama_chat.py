"""The Ollama dialect's inference routes end to end: the official `ollama` SDK against `blazar serve` with the real
llama-server and the real Gemma 3 270M (a base model: the protocol and the shapes are asserted, never the words)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx2
import jsonschema
import ollama
import pytest

from tests.support import sdk_daemons
from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.sdk_daemons import MODEL, OllamaDaemon

daemon = sdk_daemons.ollama_daemon

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "color": {"enum": ["red", "blue"]}},
          "required": ["n", "color"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _stats_are_ollamas(r: ollama.ChatResponse | ollama.GenerateResponse, most: int) -> None:
    assert r.done is True and r.done_reason in ("stop", "length")
    assert r.prompt_eval_count and r.prompt_eval_count > 0 and r.eval_count and 0 < r.eval_count <= most
    # Nanoseconds, as Ollama reports them: a generation of a few tokens takes well over a microsecond.
    assert isinstance(r.total_duration, int) and r.total_duration > 1_000
    assert isinstance(r.eval_duration, int) and 0 < r.eval_duration <= r.total_duration
    assert isinstance(r.load_duration, int) and r.load_duration >= 0


def test_chat_answers_with_ollamas_fields_and_records_the_request(daemon: OllamaDaemon) -> None:
    r = daemon.client().chat(MODEL, messages=[{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hello"}],
                             stream=False, options={"num_predict": 6, "temperature": 0.2, "seed": 7, "top_k": 20})
    assert r.model == MODEL and r.message.role == "assistant" and isinstance(r.message.content, str)
    _stats_are_ollamas(r, 6)
    done = wait_for(lambda: [e for e in read_events(daemon.home, "request.received")
                             if e["data"]["route"] == "/api/chat"], "the chat's request.received")
    assert done[0]["data"]["dialect"] == "ollama" and done[0]["data"]["max_tokens"] == 6
    trace = done[0]["trace_id"]
    types = wait_for(lambda: (t := [e["type"] for e in read_events(daemon.home) if e["trace_id"] == trace])
                     and t[-1] == "request.completed" and t, "request.completed")
    assert types[0] == "request.received" and "request.first_token" in types
    completed = next(e for e in read_events(daemon.home, "request.completed") if e["trace_id"] == trace)["data"]
    assert completed["prompt_tokens"] == r.prompt_eval_count and completed["completion_tokens"] == r.eval_count


@pytest.mark.parametrize("stream", [False, True])
def test_chat_and_generate_return_the_tokens_log_probabilities_when_asked(daemon: OllamaDaemon, stream: bool) -> None:
    client = daemon.client()
    chat = client.chat(MODEL, messages=[{"role": "user", "content": "Hello"}], stream=stream, logprobs=True,
                       top_logprobs=2, options={"num_predict": 4, "temperature": 0})
    gen = client.generate(MODEL, "The sea is", stream=stream, logprobs=True, options={"num_predict": 4})
    for answer in (chat, gen):
        parts = list(answer) if stream else [answer]
        probs = [t for p in parts for t in (p.logprobs or ())]
        assert 0 < len(probs) <= 4 and all(t.logprob <= 0 for t in probs)
    if not stream:
        assert chat.logprobs and all(len(t.top_logprobs or ()) == 2 for t in chat.logprobs)
        assert gen.logprobs and not gen.logprobs[0].top_logprobs


def test_chat_streams_ndjson_by_default(daemon: OllamaDaemon) -> None:
    parts = list(daemon.client().chat(MODEL, messages=[{"role": "user", "content": "Count to five"}], stream=True,
                                      options={"num_predict": 8}))
    assert len(parts) >= 2 and all(p.model == MODEL for p in parts)
    assert all(p.done is False for p in parts[:-1]) and "".join(p.message.content or "" for p in parts[:-1])
    _stats_are_ollamas(parts[-1], 8)
    with httpx2.stream("POST", f"{daemon.base}/api/chat", json={"model": MODEL, "options": {"num_predict": 2},
                       "messages": [{"role": "user", "content": "Hi"}]}, trust_env=False, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] is True


@pytest.mark.parametrize("stream", [False, True])
def test_generate_plain_and_raw(daemon: OllamaDaemon, stream: bool) -> None:
    client = daemon.client()
    for raw in (False, True):
        got = client.generate(MODEL, prompt="The sea is", raw=raw, stream=stream, options={"num_predict": 5})
        if stream:
            parts = list(got)
            text, last = "".join(p.response for p in parts[:-1]), parts[-1]
        else:
            text, last = got.response, got
        assert isinstance(text, str) and text
        _stats_are_ollamas(last, 5)


def test_format_schema_output_parses_and_matches(daemon: OllamaDaemon) -> None:
    client = daemon.client()
    greedy = {"num_predict": 60, "temperature": 0}  # the grammar bounds the shape; greedy makes it repeatable
    chat = client.chat(MODEL, messages=[{"role": "user", "content": "Pick"}], format=SCHEMA, options=greedy)
    jsonschema.validate(json.loads(chat.message.content), SCHEMA)
    for raw in (False, True):
        gen = client.generate(MODEL, prompt="Pick", format=SCHEMA, raw=raw, options=greedy)
        jsonschema.validate(json.loads(gen.response), SCHEMA)


def test_tool_definitions_and_a_tool_round_trip_are_accepted(daemon: OllamaDaemon) -> None:
    # Ollama has no tool_choice to force a call (the OpenAI and Anthropic tests force one); here the history of a
    # call and its result goes to the engine in its shape and the next turn is answered.
    r = daemon.client().chat(MODEL, tools=[WEATHER], stream=False, options={"num_predict": 6}, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": '{"temperature_c": 18}'}])
    assert r.message.role == "assistant" and r.done is True
    assert r.prompt_eval_count and r.prompt_eval_count > 20  # the history and the tool's result were in the prompt


def test_errors_are_ollamas_shape(daemon: OllamaDaemon) -> None:
    client = daemon.client()
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(MODEL, messages=[{"role": "user", "content": "x"}], options={"num_predict": 2, "bogus": 1})
    assert e.value.status_code == 400 and "invalid option provided: bogus" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat("nosuch", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404 and "nosuch" in e.value.error
    for body in ({"model": MODEL, "prompt": "x", "keep_alive": "5x"},
                 {"model": MODEL, "prompt": "x", "format": {"type": "object", "properties": 3}},
                 {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}):
        route = "/api/chat" if "messages" in body else "/api/generate"
        r = httpx2.post(f"{daemon.base}{route}", json=body, trust_env=False, timeout=60)
        assert r.status_code == 400, body
        assert list(r.json()) == ["error"] and isinstance(r.json()["error"], str)


def test_empty_requests_load_and_unload_and_ps_follows(daemon: OllamaDaemon) -> None:
    client = daemon.client()
    r = client.generate(MODEL, prompt="", keep_alive="10m")
    assert r.done is True and r.done_reason == "load" and r.response == ""
    (m,) = client.ps().models
    assert m.model == MODEL and m.size and m.size > 0
    left = m.expires_at - datetime.now(UTC)
    assert timedelta(minutes=9) < left <= timedelta(minutes=10, seconds=5)
    r = client.chat(MODEL, messages=[], keep_alive=-1)
    assert r.done_reason == "load"
    assert client.ps().models[0].expires_at.year > 2100  # forever
    r = client.chat(MODEL, messages=[], keep_alive=0)
    assert r.done_reason == "unload"
    assert client.ps().models == []


def test_num_ctx_is_served_by_a_covering_instance_and_reloads_only_when_it_must(daemon: OllamaDaemon) -> None:
    client = daemon.client()
    client.generate(MODEL, prompt="", keep_alive="5m")
    (before,) = client.ps().models
    small = client.generate(MODEL, prompt="Hi", options={"num_ctx": 256, "num_predict": 2})
    assert small.done
    (same,) = client.ps().models
    assert same.context_length == before.context_length  # served where it was, no reload
    bigger = before.context_length * 2
    client.generate(MODEL, prompt="Hi", options={"num_ctx": bigger, "num_predict": 2})
    (after,) = client.ps().models
    assert after.context_length >= bigger


def test_embed_and_legacy_embeddings(daemon: OllamaDaemon) -> None:
    client = daemon.client()
    r = client.embed(MODEL, input=["The sea", "A lighthouse"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == len(r.embeddings[1]) > 0
    assert r.prompt_eval_count and r.prompt_eval_count > 0
    one = client.embeddings(MODEL, prompt="The sea")
    assert len(one.embedding) == len(r.embeddings[0])
