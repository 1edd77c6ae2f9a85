"""Thinking budgets end to end (docs/8.GATEWAY.md, "Reasoning"): the real Gemma, a base model, served with a template
whose generation prompt opens a thinking section, so it writes its continuation there; llama-server parses it as
reasoning and, held to the budget Blazar sends, closes the section after N tokens so that the answer follows. Through
each official SDK, streamed and whole: the reasoning comes back in the dialect's own shape, holds at most N tokens
(the engine's own count), an answer follows it, and request.completed says how it was bounded.

The model's budget is small (`blazar model set --reasoning-budget`): it is the ceiling of every request's, so an
Anthropic client, held to budget_tokens >= 1024 by its API's rule, gets it too; a few tokens keep the suite fast."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support.daemon import wait_for
from tests.support.sdk_daemons import OpenAIDaemon
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "thinker"
BUDGET = 8
MAX_TOKENS = BUDGET + 8  # room for an answer after the thinking
# ChatML whose assistant turn opens with a thinking section (Qwen3's shape): llama-server recognises <think>...</think>
# as the reasoning, and with thinking turned off the section comes closed.
THINKING = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{%- if m['role'] == 'assistant' and m['reasoning_content'] is defined and m['reasoning_content'] -%}"
    "{{ '<think>\\n' + m['reasoning_content'] + '\\n</think>\\n\\n' }}{%- endif -%}"
    "{{ (m['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else -%}{{ '<think>\\n' }}{%- endif -%}{%- endif -%}")
ASK = "Tell me about the sea."
CTX = 256
# Anthropic's max_tokens must exceed its budget_tokens (>= 1024): what bounds its answer is the context, which this
# system prompt fills but for ~25 tokens (its ~230 tokens are read once: the second request reuses them).
FILLER = "The sea is wide and deep. " * 26


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[OpenAIDaemon]:
    home = tmp_path_factory.mktemp("reasoning-home")

    def budgeted(home: Path) -> None:  # through the CLI: the flag is part of what is tested
        blazar_cli(home, "model", "set", MODEL, "--reasoning-budget", str(BUDGET))

    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": CTX, "slots": 1}, template=THINKING,
                       before_serve=budgeted) as (port, proc):
        yield OpenAIDaemon(home, port, proc)


def _tokens(daemon: OpenAIDaemon, text: str) -> int:
    """The engine's own count of `text` (its /tokenize, with the instance's key)."""
    routed = daemon.events("request.routed")[-1]["data"]
    key = (daemon.home / "run" / "instances" / f"{routed['instance_id']}.key").read_text().strip()
    r = httpx.post(f"http://127.0.0.1:{routed['port']}/tokenize", json={"content": text, "add_special": False},
                   headers={"Authorization": f"Bearer {key}"}, timeout=60, trust_env=False)
    r.raise_for_status()
    return len(r.json()["tokens"])


def _completed(daemon: OpenAIDaemon, trace: str) -> dict[str, Any]:
    daemon.wait_trace(trace, "request.completed")
    return next(e for e in daemon.events("request.completed") if e["trace_id"] == trace)["data"]


def _held(daemon: OpenAIDaemon, trace: str, reasoning: str, answer: str, effort: str | None,
          streamed: bool) -> None:
    """The reasoning is there, within the budget by the engine's count, an answer follows it, and the event says how
    it was bounded."""
    assert reasoning.strip() and answer.strip(), (reasoning, answer)
    assert _tokens(daemon, reasoning) <= BUDGET
    facts = _completed(daemon, trace)["reasoning"]
    assert facts["budget"] == BUDGET and facts["effort"] == effort and facts["enforced_by"] == "engine"
    if streamed:
        assert 0 < facts["reasoning_tokens"] <= BUDGET + 1  # one delta per token; the closing tag's may carry text
    else:
        assert facts["reasoning_tokens"] is None


def test_openai_chat_reasoning_effort_whole_and_streamed(daemon: OpenAIDaemon) -> None:
    client = daemon.client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": ASK}], max_tokens=MAX_TOKENS, reasoning_effort="high")
    message = raw.parse().choices[0].message
    reasoning = getattr(message, "reasoning_content", None) or (message.model_extra or {}).get("reasoning_content")
    _held(daemon, raw.headers["x-blazar-trace-id"], reasoning or "", message.content or "", "high", streamed=False)

    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": ASK}], max_tokens=MAX_TOKENS, stream=True,
            reasoning_effort="low") as response:
        trace = response.headers["x-blazar-trace-id"]
        thought, said = [], []
        for chunk in response.parse():
            for choice in chunk.choices:
                thought.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
                said.append(choice.delta.content or "")
    _held(daemon, trace, "".join(thought), "".join(said), "low", streamed=True)


def test_openai_reasoning_effort_out_of_the_documented_values_is_a_400(daemon: OpenAIDaemon) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}],
                                                max_tokens=4, reasoning_effort="huge")  # type: ignore[arg-type]
    assert "reasoning_effort" in str(e.value)
    with pytest.raises(openai.BadRequestError, match=r"reasoning\.effort"):
        daemon.client().responses.create(model=MODEL, input=ASK, reasoning={"effort": "huge"})  # type: ignore[typeddict-item]


def test_responses_reasoning_effort_is_a_reasoning_item_whole_and_streamed(daemon: OpenAIDaemon) -> None:
    client = daemon.client()
    raw = client.responses.with_raw_response.create(model=MODEL, input=ASK, max_output_tokens=MAX_TOKENS,
                                                    reasoning={"effort": "medium"}, store=False)
    response = raw.parse()
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.reasoning is not None and response.reasoning.effort == "medium"
    reasoning = "".join(c.text for c in response.output[0].content or [])  # type: ignore[union-attr]
    _held(daemon, raw.headers["x-blazar-trace-id"], reasoning, response.output_text, "medium", streamed=False)

    with client.responses.with_streaming_response.create(model=MODEL, input=ASK, max_output_tokens=MAX_TOKENS,
                                                         reasoning={"effort": "medium"}, store=False,
                                                         stream=True) as streamed:
        trace = streamed.headers["x-blazar-trace-id"]
        events = list(streamed.parse())
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    _held(daemon, trace, thought, said, "medium", streamed=True)


def test_anthropic_thinking_blocks_whole_and_streamed_within_the_models_budget(daemon: OpenAIDaemon) -> None:
    client = anthropic.Anthropic(base_url=daemon.base, api_key="unused", max_retries=0, timeout=120)
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}  # Anthropic's least; the model's ceiling is BUDGET
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=1024 + MAX_TOKENS, thinking=thinking,
                                                   system=FILLER, messages=[{"role": "user", "content": ASK}])
    message = raw.parse()
    assert [b.type for b in message.content] == ["thinking", "text"]
    _held(daemon, raw.headers["x-blazar-trace-id"], message.content[0].thinking,  # type: ignore[union-attr]
          message.content[1].text, None, streamed=False)  # type: ignore[union-attr]

    with client.messages.stream(model=MODEL, max_tokens=1024 + MAX_TOKENS, thinking=thinking, system=FILLER,
                                messages=[{"role": "user", "content": ASK}]) as stream:
        events = list(stream)
        final = stream.get_final_message()
        trace = stream.response.headers["x-blazar-trace-id"]
    assert [e.content_block.type for e in events if e.type == "content_block_start"] == ["thinking", "text"]
    thought = "".join(e.delta.thinking for e in events
                      if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
    assert final.content[0].thinking == thought  # type: ignore[union-attr]
    _held(daemon, trace, thought, final.content[1].text, None, streamed=True)  # type: ignore[union-attr]


def test_anthropic_budget_below_1024_or_not_below_max_tokens_is_a_400_in_anthropics_shape(
        daemon: OpenAIDaemon) -> None:
    client = anthropic.Anthropic(base_url=daemon.base, api_key="unused", max_retries=0, timeout=120)
    for budget, max_tokens in ((16, 64), (2048, 2048)):
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model=MODEL, max_tokens=max_tokens,
                                   thinking={"type": "enabled", "budget_tokens": budget},
                                   messages=[{"role": "user", "content": ASK}])
        assert e.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "thinking.budget_tokens" in e.value.body["error"]["message"]  # type: ignore[index]


def test_ollama_think_levels_whole_and_streamed_and_a_bad_one_is_a_400(daemon: OpenAIDaemon) -> None:
    client = ollama.Client(host=daemon.base, timeout=120, trust_env=False)
    before = _last_completed(daemon)
    whole = client.chat(model=MODEL, messages=[{"role": "user", "content": ASK}], think="low",
                        options={"num_predict": MAX_TOKENS})
    trace = wait_last_completed(daemon, before)
    _held(daemon, trace, whole.message.thinking or "", whole.message.content or "", "low", streamed=False)

    parts = list(client.chat(model=MODEL, messages=[{"role": "user", "content": ASK}], think=True, stream=True,
                             options={"num_predict": MAX_TOKENS}))
    trace = wait_last_completed(daemon, trace)
    thought = "".join(p.message.thinking or "" for p in parts)
    said = "".join(p.message.content or "" for p in parts)
    _held(daemon, trace, thought, said, None, streamed=True)

    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MODEL, messages=[{"role": "user", "content": ASK}], think="extreme")  # type: ignore[arg-type]
    assert e.value.status_code == 400 and "think" in e.value.error


def _last_completed(daemon: OpenAIDaemon) -> str | None:
    traces = [e["trace_id"] for e in daemon.events("request.completed")]
    return traces[-1] if traces else None


def wait_last_completed(daemon: OpenAIDaemon, before: str | None) -> str:
    """The trace of the request.completed recorded after `before`'s (the Ollama SDK shows no headers; request
    events are group-committed)."""
    return wait_for(lambda: (last := _last_completed(daemon)) != before and last, "the chat's request.completed")


def test_the_models_budget_is_the_instances_load_flag_and_a_request_below_it_is_held_by_the_engine(
        daemon: OpenAIDaemon) -> None:
    """The engine was started with `--reasoning-budget 8` (the model's), and this build takes a request's own budget
    too: one below the flag is the engine's to hold, and nothing is reported ignored."""
    raw = daemon.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": ASK}], max_tokens=4,
        extra_body={"thinking_budget_tokens": 2})
    trace = raw.headers["x-blazar-trace-id"]
    assert "x-blazar-ignored" not in raw.headers
    facts = _completed(daemon, trace)["reasoning"]
    assert (facts["budget"], facts["enforced_by"], facts["requested"]) == (2, "engine", None)
    routed = next(e for e in daemon.events("request.routed") if e["trace_id"] == trace)["data"]
    started = next(e["data"] for e in daemon.events("instance.starting")
                   if e["data"]["instance_id"] == routed["instance_id"])
    argv = started["argv"]
    assert argv[argv.index("--reasoning-budget") + 1] == str(BUDGET)
    assert any(e["data"]["instance_id"] == routed["instance_id"] for e in daemon.events("instance.ready"))
