"""A streamed answer keeps its client waiting while the engine reads a long prompt (blazar/serving/relay.py): the
client gets a heartbeat every `stream_heartbeat_s` in its own dialect (Anthropic `ping` after `message_start`,
Responses `response.in_progress`, an SSE comment on chat completions), and the engine's own keep-alive is not taken
for a first token. Real `blazar serve` and the official SDKs; the engine is bench/fake_engine.py, which holds a
request whose last message ends with `fake_hold_first=PATH` before any event until PATH exists (no clocks: the test
releases it once it has seen the heartbeats)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2
import openai
import pytest

from tests.support.fake_serving import FakeDaemon, fake_engine, serving_fake

MODEL = "tiny"
BEATS = 3  # heartbeats seen before the engine is released


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    home, files = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("files")
    with serving_fake(home, files, MODEL, settings={"stream_heartbeat_s": 0.05}) as d:
        yield d


def _held(tmp_path: Path, name: str) -> tuple[Path, str]:
    release = tmp_path / name
    return release, f"Hello fake_hold_first={release}"


def test_anthropic_gets_message_start_then_pings_before_the_first_token(daemon: FakeDaemon, tmp_path: Path) -> None:
    release, content = _held(tmp_path, "go-raw")
    names: list[str] = []
    with httpx2.stream("POST", f"{daemon.base}/v1/messages", trust_env=False, timeout=60, json={
            "model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": content}]},
            headers={"anthropic-version": "2023-06-01"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line.removeprefix("event: "))
            if names.count("ping") == BEATS and not release.exists():
                release.touch()
    assert names[0] == "message_start" and names[1:BEATS + 1] == ["ping"] * BEATS
    assert names[BEATS + 1] == "content_block_start" and names[-1] == "message_stop"
    assert names.count("message_start") == 1


def test_the_anthropic_sdk_reads_a_stream_that_waited(daemon: FakeDaemon, tmp_path: Path) -> None:
    release, content = _held(tmp_path, "go-sdk")
    client = anthropic.Anthropic(base_url=daemon.base, api_key="none", max_retries=0, timeout=60,
                                 http_client=anthropic.DefaultHttpxClient(trust_env=False))
    with client.messages.stream(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": content}]) as s:
        kinds = []
        for event in s:
            kinds.append(event.type)
            if event.type == "message_start":  # only a heartbeat can have sent it: the engine has sent no event
                assert not release.exists()
                release.touch()
        message = s.get_final_message()
    assert kinds[0] == "message_start" and "message_stop" in kinds
    assert message.content[0].type == "text" and message.content[0].text == fake_engine.answer_text(4)
    assert message.stop_reason == "max_tokens"


def test_responses_get_response_in_progress_while_the_engine_reads(daemon: FakeDaemon, tmp_path: Path) -> None:
    release, content = _held(tmp_path, "go-responses")
    client = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="none", max_retries=0, timeout=60,
                           http_client=openai.DefaultHttpxClient(trust_env=False))
    kinds = []
    for event in client.responses.create(model=MODEL, input=content, max_output_tokens=4, stream=True):
        kinds.append(event.type)
        if kinds.count("response.in_progress") == BEATS and not release.exists():
            release.touch()
    assert kinds[:BEATS + 1] == ["response.created", *["response.in_progress"] * BEATS]
    assert kinds[-1] == "response.incomplete"  # max_output_tokens 4: the fake engine's answer runs on


def test_chat_completions_get_comments_and_the_sdk_reads_the_rest(daemon: FakeDaemon, tmp_path: Path) -> None:
    release, content = _held(tmp_path, "go-chat")
    seen: list[str] = []
    with httpx2.stream("POST", f"{daemon.base}/v1/chat/completions", trust_env=False, timeout=60, json={
            "model": MODEL, "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": content}]}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                seen.append(line)
            if seen.count(": ping") == BEATS and not release.exists():
                release.touch()
    assert seen[:BEATS] == [": ping"] * BEATS and seen[BEATS].startswith("data: ") and seen[-1] == "data: [DONE]"
    # The SDK reads such a stream (released at once: the engine's keep-alive still comes first, as a comment).
    release2, content2 = _held(tmp_path, "go-chat-sdk")
    release2.touch()
    client = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="none", max_retries=0, timeout=60,
                           http_client=openai.DefaultHttpxClient(trust_env=False))
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, max_tokens=4, stream=True, messages=[{"role": "user", "content": content2}]) if c.choices)
    assert text == fake_engine.answer_text(4)
