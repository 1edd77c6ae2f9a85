"""The OpenAI dialect end to end: the official `openai` SDK against `blazar serve` with the real llama-server and the
real Gemma 3 270M. The packaged model is a base model with no chat template, so these tests assert the protocol
(shapes, usage, status codes, headers), never the words."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import httpx2
import openai
import pytest

from tests.support import sdk_daemons
from tests.support.daemon import wait_for
from tests.support.sdk_daemons import CTX, MODEL, QUEUE_DEPTH, SLOTS, OpenAIDaemon
from tests.support.serving import blazar_cli

_cli = blazar_cli
daemon = sdk_daemons.openai_daemon  # the module-scoped real daemon


def test_models_lists_the_store(daemon: OpenAIDaemon) -> None:
    ids = [m.id for m in daemon.client().models.list()]
    assert ids == [MODEL]
    assert daemon.client().models.retrieve(MODEL).id == MODEL


def test_chat_completion_loads_on_demand_and_reports_usage(daemon: OpenAIDaemon) -> None:
    raw = daemon.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello"}], max_tokens=8)
    trace = raw.headers["x-blazar-trace-id"]
    chat = raw.parse()
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.prompt_tokens > 0 and 0 < chat.usage.completion_tokens <= 8
    types = daemon.wait_trace(trace, "request.completed")
    assert types == ["request.received", "request.routed", "request.admitted", "request.first_token",
                     "request.completed"]
    done = next(e for e in daemon.events("request.completed") if e["trace_id"] == trace)["data"]
    assert done["completion_tokens"] == chat.usage.completion_tokens and done["prompt_tokens"] > 0


def test_chat_stream_passes_the_engine_chunks_and_usage_only_when_asked(daemon: OpenAIDaemon) -> None:
    client = daemon.client()
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count"}],
                                                 max_tokens=6, stream=True))
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[-1].choices and chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert all(c.usage is None for c in chunks)  # the client did not ask
    with_usage = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count"}], max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    assert with_usage[-1].usage is not None and with_usage[-1].usage.completion_tokens > 0


def test_completions_stream_and_not(daemon: OpenAIDaemon) -> None:
    client = daemon.client()
    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5)
    assert done.choices[0].text and done.usage is not None and done.usage.completion_tokens > 0
    parts = list(client.completions.create(model=MODEL, prompt="One, two,", max_tokens=5, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices)


def test_embeddings(daemon: OpenAIDaemon) -> None:
    emb = daemon.client().embeddings.create(model=MODEL, input=["hello world", "good night"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 640
    assert emb.data[0].embedding != emb.data[1].embedding
    # The instance that serves embeddings still chats.
    chat = daemon.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=2)
    assert chat.choices


def test_responses_stateless_stream_and_not(daemon: OpenAIDaemon) -> None:
    client = daemon.client()
    r = client.responses.create(model=MODEL, input="Say hi", max_output_tokens=5)
    # A base model runs on past 5 tokens: the answer is cut, as OpenAI says it (incomplete, max_output_tokens).
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output and r.usage is not None and 0 < r.usage.output_tokens <= 5
    events = list(client.responses.create(model=MODEL, input="Say hi", max_output_tokens=5, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"


def test_unknown_model_is_404_in_openai_shape(daemon: OpenAIDaemon) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        daemon.client().chat.completions.create(model="nosuch", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404
    assert e.value.body["code"] == "model_not_found" and "nosuch" in e.value.body["message"]
    trace = e.value.response.headers["x-blazar-trace-id"]
    assert daemon.wait_trace(trace, "request.rejected") == ["request.received", "request.rejected"]


def test_bad_json_wrong_types_and_oversized_bodies_are_4xx(daemon: OpenAIDaemon) -> None:
    url = f"{daemon.base}/v1/chat/completions"
    r = httpx2.post(url, content=b"{not json", headers={"content-type": "application/json"}, trust_env=False)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx2.post(url, json={"model": MODEL, "messages": "hi"}, trust_env=False)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx2.post(url, json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
                    trust_env=False)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx2.post(url, content=b"x" * (33 << 20), headers={"content-type": "application/json"}, trust_env=False,
                    timeout=60)
    assert r.status_code == 413 and "x-blazar-trace-id" in r.headers


def test_context_overflow_is_400_with_the_numbers_never_truncation(daemon: OpenAIDaemon) -> None:
    # A prompt over the context (an output over it is bounded instead: tests/integration/test_agent_surface.py).
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "word " * 1200}], max_tokens=400)
    body = e.value.body
    assert body["code"] == "context_length_exceeded"
    assert "prompt is" in body["message"] and f"context is {CTX} tokens" in body["message"]
    assert "never truncated" in body["message"]


def test_a_client_supplied_trace_id_is_kept(daemon: OpenAIDaemon) -> None:
    mine = "0123456789abcdef0123456789abcdef"
    raw = daemon.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1,
        extra_headers={"x-blazar-trace-id": mine})
    assert raw.headers["x-blazar-trace-id"] == mine
    daemon.wait_trace(mine, "request.completed")


async def _flood(daemon: OpenAIDaemon, n: int) -> list:
    client = daemon.aclient()

    async def one() -> object:
        try:
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Tell a story"}], max_tokens=24, stream=True,
                extra_body={"ignore_eos": True})
            return [c async for c in stream]
        except openai.APIError as e:
            return e

    try:
        return await asyncio.wait_for(asyncio.gather(*(one() for _ in range(n))), 300)
    finally:
        await client.close()


def test_a_flood_gets_429_with_retry_after_while_the_others_complete(daemon: OpenAIDaemon) -> None:
    n = SLOTS + QUEUE_DEPTH + 4
    results = asyncio.run(_flood(daemon, n))
    refused = [r for r in results if isinstance(r, openai.APIStatusError)]
    served = [r for r in results if isinstance(r, list)]
    assert refused and served and len(refused) + len(served) == n, [r for r in results if not isinstance(r, list)]
    assert len(served) >= SLOTS + QUEUE_DEPTH, [(r.status_code, r.body) for r in refused]
    for r in refused:
        assert r.status_code == 429 and r.body["code"] == "queue_full"
        assert int(r.response.headers["retry-after"]) >= 1
    for chunks in served:
        assert chunks[-1].choices[0].finish_reason == "length"
    queued = daemon.events("request.queued")
    assert queued, "some requests waited for a slot"
    snap = httpx2.get(f"{daemon.base}/api/blazar/queue", trust_env=False).json()["queues"][MODEL]
    assert snap["busy"] == 0 and snap["queued"] == 0


def test_a_client_disconnect_cancels_the_engine_request_and_frees_the_slot(daemon: OpenAIDaemon) -> None:
    mine = "disconnect-" + os.urandom(8).hex()
    with httpx2.stream("POST", f"{daemon.base}/v1/chat/completions", trust_env=False, timeout=60,
                       headers={"x-blazar-trace-id": mine},
                       json={"model": MODEL, "messages": [{"role": "user", "content": "Go on"}], "max_tokens": 400,
                             "stream": True, "ignore_eos": True}) as r:
        assert r.status_code == 200
        next(r.iter_raw())  # the first token arrived; now hang up
    daemon.wait_trace(mine, "request.failed")
    failed = next(e for e in daemon.events("request.failed") if e["trace_id"] == mine)["data"]
    assert failed["reason"] == "client_disconnected"
    wait_for(lambda: httpx2.get(f"{daemon.base}/api/blazar/queue", trust_env=False).json()["queues"][MODEL]["busy"]
             == 0, "the slot to be free")
    # The engine stopped generating: a new request gets a slot and is served (not queued behind a ghost).
    fresh = daemon.client().completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=1)
    assert "request.queued" not in daemon.wait_trace(fresh.headers["x-blazar-trace-id"], "request.completed")


def test_ready_proves_generation_and_metrics_count_requests(daemon: OpenAIDaemon) -> None:
    r = httpx2.get(f"{daemon.base}/ready", trust_env=False, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["checks"]["generate"]["ok"] is True
    daemon.client().completions.create(model=MODEL, prompt="x", max_tokens=1)
    text = wait_for(lambda: (t := httpx2.get(f"{daemon.base}/metrics", trust_env=False).text)
                    and 'blazar_requests_total{' in t and t, "request metrics")
    assert "# TYPE blazar_requests_total counter" in text and f'model="{MODEL}"' in text
    assert "blazar_ttft_seconds_bucket" in text


def test_why_explains_a_completed_and_a_rejected_request(daemon: OpenAIDaemon) -> None:
    raw = daemon.client().completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=2)
    ok = raw.headers["x-blazar-trace-id"]
    daemon.wait_trace(ok, "request.completed")
    out = _cli(daemon.home, "why", ok, "--json", timeout=60).stdout
    data = json.loads(out)
    assert data["trace_id"] == ok and "completed" in data["verdict"].lower()
    with pytest.raises(openai.NotFoundError) as e:
        daemon.client().completions.create(model="nosuch", prompt="x")
    bad = e.value.response.headers["x-blazar-trace-id"]
    daemon.wait_trace(bad, "request.rejected")
    last = _cli(daemon.home, "why", timeout=60).stdout
    assert bad in last and "nosuch" in last


def test_an_alias_resolves_to_its_model(daemon: OpenAIDaemon) -> None:
    _cli(daemon.home, "alias", "gpt-4o-mini", MODEL)  # recorded by another process: the daemon follows the log

    def answered() -> bool:
        try:
            daemon.client().completions.create(model="gpt-4o-mini", prompt="x", max_tokens=1)
            return True
        except openai.NotFoundError:
            return False

    wait_for(answered, "the alias to reach the daemon", timeout=10)
    routed = daemon.events("request.routed")[-1]["data"]
    assert routed["model"] == MODEL


def test_why_explains_a_queued_request(daemon: OpenAIDaemon) -> None:
    queued = {e["trace_id"] for e in daemon.events("request.queued")}
    completed = [e["trace_id"] for e in daemon.events("request.completed") if e["trace_id"] in queued]
    assert completed, "the flood test left requests that queued and then completed"
    data = json.loads(_cli(daemon.home, "why", completed[0], "--json", timeout=60).stdout)
    assert "waited" in data["verdict"] and data["figures"]["queue_wait_ms"] > 0
    assert any(s["type"] == "request.queued" for s in data["steps"])


@pytest.mark.parametrize("asked", [MODEL, "gpt-4o-mini"])  # the store's name, and an alias of it
def test_every_answer_names_the_model_as_the_client_asked_never_a_path(daemon: OpenAIDaemon, asked: str) -> None:
    """LiteLLM and Ollama answer with the requested name; the engine alone would say its file's path. (The alias
    comes from test_an_alias_resolves_to_its_model, above.)"""
    client = daemon.client()
    chat = client.chat.completions.create(model=asked, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert chat.model == asked
    chunks = list(client.chat.completions.create(model=asked, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=3, stream=True))
    assert chunks and {c.model for c in chunks} == {asked}
    text = client.completions.create(model=asked, prompt="Hello", max_tokens=2)
    assert text.model == asked
    streamed = list(client.completions.create(model=asked, prompt="Hello", max_tokens=3, stream=True))
    assert streamed and {c.model for c in streamed} == {asked}
    with httpx2.Client(trust_env=False, timeout=60) as http:
        raw = http.post(f"{daemon.base}/v1/chat/completions", json={
            "model": asked, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True})
    assert ".gguf" not in raw.text and str(daemon.home) not in raw.text


# -- the prefix cache explained (docs/8.GATEWAY.md, "Prefix cache") ---------------------------------------------------

# A system prompt long enough that prefilling it again is worth a word (blazar/serving/prefix.py
# MIN_REPROCESSED_TOKENS: 64), short enough to cost little.
_RULES = " ".join(f"Rule {i}: answer in plain short words." for i in range(1, 13))
_TURNS = 4  # three comparisons: enough breaks in a row to flag a client (blazar/projections/prefix.py FLAG_STREAK)


def _conversation(turn: int, *, fresh_time: bool) -> list[dict[str, str]]:
    """Turn `turn` (1-based) of a chat: the system prompt (with a fresh timestamp at its start, or none), every
    earlier turn, the new question."""
    clock = f"Now: 2026-12-07 06:4{turn}:17." if fresh_time else "Now: 2026-12-07."
    messages = [{"role": "system", "content": f"{clock} {_RULES}"}, {"role": "user", "content": "Name a colour."}]
    for i in range(1, turn):
        messages += [{"role": "assistant", "content": f"Colour {i}."}, {"role": "user", "content": f"Another, {i}."}]
    return messages


def _chat_turns(daemon: OpenAIDaemon, agent: str, *, fresh_time: bool) -> list[str]:
    """_TURNS turns of one conversation from the program `agent` (its User-Agent), one at a time: their traces."""
    client, traces = daemon.client(default_headers={"User-Agent": f"{agent}/2.0 (test)"}), []
    for turn in range(1, _TURNS + 1):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=_conversation(turn, fresh_time=fresh_time), max_tokens=2, temperature=0)
        traces.append(raw.headers["x-blazar-trace-id"])
        daemon.wait_trace(traces[-1], "request.completed")
    return traces


def test_the_prefix_cache_miss_of_a_fresh_timestamp_is_named_costed_and_flagged_and_a_growing_chat_is_not(
        daemon: OpenAIDaemon) -> None:
    flappy = _chat_turns(daemon, "flappy", fresh_time=True)
    tidy = _chat_turns(daemon, "tidy", fresh_time=False)
    compared = {e["trace_id"]: e["data"] for e in daemon.events("request.prefix_compared")}

    # Each turn after the first was compared with the one before it (no session: its slot, and its program).
    broke = [compared[t] for t in flappy[1:]]
    for ev, previous in zip(broke, flappy, strict=False):
        assert (ev["previous_trace_id"], ev["part"], ev["message_index"], ev["missed"], ev["agent"]) == \
            (previous, "system", 0, True, "flappy")
        assert ev["reprocessed_tokens"] >= 64 and ev["reused_tokens"] < ev["previous_prompt_tokens"] / 2
        assert ev["prefill_ms"] is not None and ev["prefill_ms"] > 0  # the engine's own timings.prompt_ms
    kept = [compared[t] for t in tidy[1:]]
    assert all(not ev["missed"] and ev["part"] is None for ev in kept), kept
    assert all(ev["reused_tokens"] >= ev["previous_prompt_tokens"] / 2 for ev in kept), kept

    # `blazar why` of the second turn: the message, the part, the tokens prefilled again and the engine's time.
    why = json.loads(_cli(daemon.home, "why", flappy[1], "--json").stdout)
    step = next(s for s in why["steps"] if s["type"] == "request.prefix_compared")
    first = broke[0]
    assert step["text"].startswith(
        f"prefix cache missed: the prompt first differed at message 0 (system) from this client's previous request "
        f"on slot {first['slot_id']} ({flappy[0]}); {first['reprocessed_tokens']:,} tokens prefilled again, ")
    assert "the prompt first differed at message 0 (system)" in why["verdict"]

    # Three breaks in a row flag the client; the growing conversation is not flagged.
    rows = {r["agent"]: r for r in json.loads(_cli(daemon.home, "why", "--clients", "--json").stdout)}
    assert (rows["flappy"]["flagged"], rows["flappy"]["streak"], rows["flappy"]["changed"]) == \
        (True, _TURNS - 1, "message 0 (system)")
    assert (rows["tidy"]["flagged"], rows["tidy"]["breaks"], rows["tidy"]["turns"]) == (False, 0, _TURNS - 1)

    # The console's dashboard lists the flagged client, and not the other.
    def listed() -> list[dict] | None:
        got = httpx2.get(f"{daemon.base}/api/blazar/dashboard", timeout=30, trust_env=False).json()
        return got["prefix_clients"] if any(r["agent"] == "flappy" for r in got["prefix_clients"]) else None

    agents = {r["agent"]: r for r in wait_for(listed, "the flagged client on the console's dashboard")}
    assert "tidy" not in agents and agents["flappy"]["break_trace_id"] == flappy[-1]


def test_sigterm_drains_a_stream_in_flight_then_stops(daemon: OpenAIDaemon) -> None:
    """Last in this module: it stops the daemon. A stream that started before SIGTERM runs to its end (within
    stop_grace_s, 10 s: 12 tokens take well under that even on a busy machine)."""
    got: list[bytes] = []
    with httpx2.stream("POST", f"{daemon.base}/v1/chat/completions", trust_env=False, timeout=120,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "Go"}], "max_tokens": 12,
                             "stream": True, "ignore_eos": True}) as r:
        it = r.iter_raw()
        got.append(next(it))
        daemon.proc.send_signal(signal.SIGTERM)
        got.extend(it)
    body = b"".join(got)
    assert body.rstrip().endswith(b"data: [DONE]") and b'"finish_reason":"length"' in body
    assert daemon.proc.wait(timeout=60) == 0

