"""A streamed chat answer of a model served with the template its probe chose (greedy) ends where it loops
(blazar/serving/loop_guard.py): a stop in each dialect, the engine's usage so far, `request.loop_stopped` in the log
and in `blazar why`; an answer that does not loop runs to its limit. Real `blazar serve` and the official SDKs
(openai, anthropic, ollama); the engine is bench/fake_engine.py, whose answer to a last message ending in
`fake_loop` is one sentence over and over (its other answers number each sentence: no loop). The tiny model has no
chat template, so its first load probes one, as a base model's would. The real engine's loop:
tests/integration/test_first_answer.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from blazar.serving.loop_guard import SPAN_CHARS
from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.fake_serving import FakeDaemon, fake_engine, serving_fake
from tests.support.serving import blazar_cli

MODEL = "tiny"
LOOPING = "Go on fake_loop"
SENTENCE = len(fake_engine.answer_text(len(fake_engine.WORDS), loop=True))  # the loop's piece: 44 characters
ASKED = 2000  # tokens asked for: far more than the guard lets a loop run


class Daemon:
    def __init__(self, home: Path, fake: FakeDaemon) -> None:
        self.home, self.base = home, fake.base

    def stopped(self, trace: str) -> list[dict[str, Any]]:
        return [e["data"] for e in read_events(self.home, "request.loop_stopped") if e["trace_id"] == trace]

    def completed(self, trace: str) -> dict[str, Any]:
        """The trace's `request.completed`, waited for: request events are group-committed, so the answer can reach
        the client before its events reach the log (and a loop's stop is written before it, in the same order)."""
        def done() -> list[dict[str, Any]]:
            return [e["data"] for e in read_events(self.home, "request.completed") if e["trace_id"] == trace]

        (found,) = wait_for(done, f"request.completed of {trace}")
        return found


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    home, files = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("files")
    with serving_fake(home, files, MODEL) as fake:
        yield Daemon(home, fake)


def _openai(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="none", max_retries=0, timeout=120,
                         http_client=openai.DefaultHttpxClient(trust_env=False))


def _stopped_once(daemon: Daemon, trace: str, tokens: int) -> None:
    done = daemon.completed(trace)  # first: once it is in the log, so is the stop
    (stop,) = daemon.stopped(trace)
    assert stop["period_chars"] == SENTENCE and stop["span_chars"] == SPAN_CHARS
    assert stop["completion_tokens"] == tokens < ASKED
    assert done["finish_reason"] == "stop" and done["completion_tokens"] == tokens and done["prompt_tokens"] > 0


def test_a_chat_stream_that_loops_ends_as_a_stop_where_the_loop_was_found(daemon: Daemon) -> None:
    raw = _openai(daemon).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": LOOPING}], max_tokens=ASKED, stream=True,
        stream_options={"include_usage": True})
    trace = raw.headers["x-blazar-trace-id"]
    text, finish, usage, models = [], None, None, set()
    for chunk in raw.parse():
        models.add(chunk.model)
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    said, tokens = "".join(text), len([t for t in text if t])
    assert finish == "stop" and models == {MODEL}
    assert said == fake_engine.answer_text(tokens, loop=True)
    assert SPAN_CHARS <= len(said) < SPAN_CHARS + 3 * SENTENCE  # stopped within a few rounds of the loop's proof
    assert usage is not None and usage.completion_tokens == tokens and usage.prompt_tokens > 0
    _stopped_once(daemon, trace, usage.completion_tokens)
    why = blazar_cli(daemon.home, "why", trace).stdout
    assert f"stopped in a loop after {usage.completion_tokens} tokens" in why


def test_the_anthropic_sdk_gets_an_end_turn(daemon: Daemon) -> None:
    client = anthropic.Anthropic(base_url=daemon.base, api_key="none", max_retries=0, timeout=120,
                                 http_client=anthropic.DefaultHttpxClient(trust_env=False))
    with client.messages.stream(model=MODEL, max_tokens=ASKED, messages=[{"role": "user", "content": LOOPING}]) as s:
        message = s.get_final_message()
        trace = s.response.headers["x-blazar-trace-id"]
    assert message.stop_reason == "end_turn" and len(message.content[0].text) >= SPAN_CHARS  # type: ignore[union-attr]
    assert message.usage.input_tokens > 0
    _stopped_once(daemon, trace, message.usage.output_tokens)


def test_a_responses_stream_completes_rather_than_incomplete(daemon: Daemon) -> None:
    # Codex's way in: an incomplete response (max_output_tokens) is an error to it; a stopped loop is an answer.
    with _openai(daemon).responses.with_streaming_response.create(
            model=MODEL, input=LOOPING, max_output_tokens=ASKED, stream=True) as raw:
        trace = raw.headers["x-blazar-trace-id"]
        kinds = []
        for line in raw.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                kinds.append(event["type"])
                if event["type"] == "response.completed":
                    final = event["response"]
    assert kinds[-1] == "response.completed" and final["status"] == "completed"
    assert len(final["output"][0]["content"][0]["text"]) >= SPAN_CHARS
    _stopped_once(daemon, trace, final["usage"]["output_tokens"])


def test_ollama_gets_done_with_a_stop(daemon: Daemon) -> None:
    client = ollama.Client(host=daemon.base, timeout=120)
    parts = list(client.chat(model=MODEL, messages=[{"role": "user", "content": LOOPING}], stream=True,
                             options={"num_predict": ASKED}))
    assert parts[-1].done and parts[-1].done_reason == "stop" and parts[-1].eval_count < ASKED
    assert len("".join(p.message.content or "" for p in parts)) >= SPAN_CHARS
    # This module's requests run one at a time; its stop is group-committed, so it is waited for.
    stops = wait_for(lambda: [e["data"] for e in read_events(daemon.home, "request.loop_stopped")
                              if e["data"]["completion_tokens"] == parts[-1].eval_count], "the chat's loop stop")
    assert stops[-1]["period_chars"] == SENTENCE


def test_an_answer_that_does_not_loop_runs_to_its_limit(daemon: Daemon) -> None:
    n = 300  # long enough to have looped, were its sentences not numbered
    raw = _openai(daemon).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Go on"}], max_tokens=n, stream=True)
    trace = raw.headers["x-blazar-trace-id"]
    chunks = list(raw.parse())
    said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert said == fake_engine.answer_text(n) and chunks[-1].choices[0].finish_reason == "length"
    assert daemon.completed(trace)["finish_reason"] == "length"  # its events are in the log: no stop among them
    assert not daemon.stopped(trace)


def test_a_whole_answer_is_not_guarded(daemon: Daemon) -> None:
    # The engine answers it in one piece: nothing to stop early (docs/4.MODELS.md says so).
    n = 200
    answer = _openai(daemon).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": LOOPING}], max_tokens=n)
    assert answer.choices[0].message.content == fake_engine.answer_text(n, loop=True)
    assert answer.choices[0].finish_reason == "length"
