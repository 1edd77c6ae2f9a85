"""The prefix cache explained, end to end: the official `openai` SDK against `blazar serve` with the real llama-server
and Gemma. A client that puts a fresh timestamp at the start of its system prompt every turn makes the engine prefill
the whole prompt again each time: `blazar why` of such a turn names the message and the part that changed and what
the prefill cost (the engine's own cached tokens and prompt time), and after three such turns in a row the client is
flagged (`blazar why --clients`, the console's dashboard). A client whose conversation only grows is not."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai

from tests.support import sdk_daemons
from tests.support.daemon import wait_for
from tests.support.sdk_daemons import MODEL, OpenAIDaemon
from tests.support.serving import blazar_cli

daemon = sdk_daemons.openai_daemon  # the module-scoped real daemon

# A system prompt long enough that prefilling it again is worth a word (blazar/serving/prefix.py
# MIN_REPROCESSED_TOKENS), short enough for the suite's context.
RULES = " ".join(f"Rule {i}: answer in plain short words." for i in range(1, 25))
TURNS = 4


def _system(turn: int, *, fresh_time: bool) -> dict[str, str]:
    clock = f"Now: 2026-12-07 06:4{turn}:17." if fresh_time else "Now: 2026-12-07."
    return {"role": "system", "content": f"{clock} {RULES}"}


def _conversation(turn: int, *, fresh_time: bool) -> list[dict[str, str]]:
    """The prompt of turn `turn` (1-based): the system prompt, then every earlier turn, then the new question."""
    messages = [_system(turn, fresh_time=fresh_time), {"role": "user", "content": "Name a colour."}]
    for i in range(1, turn):
        messages += [{"role": "assistant", "content": f"Colour {i}."}, {"role": "user", "content": f"Another, {i}."}]
    return messages


def _client(d: OpenAIDaemon, agent: str) -> openai.OpenAI:
    return d.client(default_headers={"User-Agent": f"{agent}/2.0 (test)"})


def _turns(d: OpenAIDaemon, agent: str, *, fresh_time: bool) -> list[str]:
    """TURNS turns of one conversation (its own session), each waited for in the log: their trace ids."""
    client, traces = _client(d, agent), []
    for turn in range(1, TURNS + 1):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=_conversation(turn, fresh_time=fresh_time), max_tokens=2, temperature=0,
            extra_headers={"X-Blazar-Session": f"prefix-{agent}"})
        trace = raw.headers["x-blazar-trace-id"]
        d.wait_trace(trace, "request.completed")
        traces.append(trace)
    return traces


def _compared(d: OpenAIDaemon, traces: list[str]) -> list[dict[str, Any]]:
    by_trace = {e["trace_id"]: e["data"] for e in d.events("request.prefix_compared")}
    return [by_trace[t] for t in traces if t in by_trace]


def test_a_fresh_timestamp_in_the_system_prompt_is_named_costed_and_flagged_and_a_growing_chat_is_not(
        daemon: OpenAIDaemon) -> None:
    flappy = _turns(daemon, "flappy", fresh_time=True)
    tidy = _turns(daemon, "tidy", fresh_time=False)

    # Every turn after the first was compared with the one before it on its session.
    broke = _compared(daemon, flappy)
    assert len(broke) == TURNS - 1
    for ev, previous in zip(broke, flappy, strict=False):
        assert (ev["previous_trace_id"], ev["part"], ev["message_index"], ev["missed"]) == (previous, "system", 0,
                                                                                             True)
        assert ev["agent"] == "flappy" and ev["session"] == "prefix-flappy"
        assert ev["reprocessed_tokens"] >= 64 and ev["reused_tokens"] < ev["previous_prompt_tokens"] / 2
        assert ev["prefill_ms"] is not None and ev["prefill_ms"] > 0
    kept = _compared(daemon, tidy)
    assert len(kept) == TURNS - 1
    assert all(not ev["missed"] and ev["part"] is None for ev in kept)
    assert all(ev["reused_tokens"] >= ev["previous_prompt_tokens"] / 2 for ev in kept)

    # `blazar why` of the second turn: the message, the part, the tokens prefilled again and the engine's time.
    why = _json(daemon, "why", flappy[1], "--json")
    step = next(s for s in why["steps"] if s["type"] == "request.prefix_compared")
    ev = broke[0]
    assert step["text"].startswith("prefix cache missed: the prompt first differed at message 0 (system) from this "
                                   f"client's previous request on session prefix-flappy ({flappy[0]}); "
                                   f"{ev['reprocessed_tokens']:,} tokens prefilled again")
    assert "the prompt first differed at message 0 (system)" in why["verdict"]

    # Three breaks in a row flag the client; the growing conversation is not flagged.
    rows = {r["agent"]: r for r in _json(daemon, "why", "--clients", "--json")}
    assert (rows["flappy"]["flagged"], rows["flappy"]["streak"], rows["flappy"]["changed"]) == \
        (True, TURNS - 1, "message 0 (system)")
    assert (rows["tidy"]["flagged"], rows["tidy"]["breaks"], rows["tidy"]["turns"]) == (False, 0, TURNS - 1)
    text = blazar_cli(daemon.home, "why", "--clients").stdout
    assert "(flappy)" in text and "(tidy)" in text

    # The console's dashboard lists the flagged client, and only it.
    def flagged() -> list[dict[str, Any]] | None:
        got = httpx2.get(f"{daemon.base}/api/blazar/dashboard", timeout=30, trust_env=False).json()["prefix_clients"]
        return got if any(r["agent"] == "flappy" for r in got) else None

    listed = wait_for(flagged, "the flagged client on the dashboard")
    assert [r["agent"] for r in listed] == ["flappy"] and listed[0]["break_trace_id"] == flappy[-1]


def _json(d: OpenAIDaemon, *args: str) -> Any:
    return json.loads(blazar_cli(d.home, *args).stdout)
