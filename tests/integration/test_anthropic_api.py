"""The Anthropic dialect through the official `anthropic` SDK against `blazar serve` with the real llama-server and
Gemma 3 270M: messages streamed and not, token counting, errors in Anthropic's shape, one pipeline (request events
with dialect "anthropic")."""

from __future__ import annotations

import anthropic
import httpx2
import pytest

from tests.integration import test_openai_api
from tests.integration.test_openai_api import MODEL, Daemon

daemon = test_openai_api.daemon  # the same module-scoped real daemon, started afresh for this module


def client(d: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=d.base, api_key="unused", max_retries=0, timeout=120)


def test_messages_answer_with_content_and_usage(daemon: Daemon) -> None:
    raw = client(daemon).messages.with_raw_response.create(
        model=MODEL, max_tokens=5, system="Be brief.", messages=[{"role": "user", "content": "Hello"}])
    msg = raw.parse()
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "text"
    assert msg.stop_reason in ("max_tokens", "end_turn") and msg.usage.output_tokens > 0
    trace = raw.headers["x-blazar-trace-id"]
    daemon.wait_trace(trace, "request.completed")
    received = next(e for e in daemon.events("request.received") if e["trace_id"] == trace)["data"]
    assert received["dialect"] == "anthropic" and received["route"] == "/v1/messages"


def test_messages_stream_the_full_event_sequence(daemon: Daemon) -> None:
    with client(daemon).messages.stream(model=MODEL, max_tokens=5,
                                        messages=[{"role": "user", "content": "Count"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_delta" in kinds and "message_delta" in kinds
    assert final.usage.output_tokens > 0


def test_count_tokens(daemon: Daemon) -> None:
    n = client(daemon).messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hello there"}])
    assert n.input_tokens > 0


def test_errors_take_anthropics_shape(daemon: Daemon) -> None:
    with pytest.raises(anthropic.NotFoundError) as e:
        client(daemon).messages.create(model="nosuch", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    r = httpx2.post(f"{daemon.base}/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                    trust_env=False)
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
