"""Keys are tenants, end to end: `blazar serve` with the real llama-server and the real Gemma 3 270M on ONE slot (so
every key's request lands where another key's prompt was), through the official SDKs. Another key's guess at a
prompt gets no signal (no cached tokens, the whole prompt evaluated, for a right guess as for a wrong one), while a
key's own repeat and keys an admin put in one cache group do reuse; session names live in each key's namespace;
single-flight shares only within a key; priority is a right; tokens streamed before a hang-up are charged; a key that
floods the slot does not put another key behind all of its requests (fair share)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
SECRET = ("Patient record 4471. Name: Alice Smith. Born: 14 March 1961. Address: 12 Harbour Lane, Bristol. "
          "Diagnosis: stage 2 melanoma, left shoulder. Treatment plan: wide local excision, then review. "
          "Notes: the patient asked that her employer is not told.")
RIGHT_GUESS = SECRET[:SECRET.index("Treatment")] + "Treatment plan: unknown."
WHOLE_GUESS = SECRET + " Follow-up: none."
WRONG_GUESS = ("Patient record 4471. Name: Bob Jones. Born: 2 July 1975. Address: 9 Mill Road, Leeds. "
               "Diagnosis: a sprained ankle. Treatment plan: unknown.")


class Tenants:
    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.base = f"http://127.0.0.1:{port}"
        self.secrets: dict[str, str] = {}

    def cli(self, *args: str, check: bool = True) -> Any:
        return blazar_cli(self.home, *args, check=check)

    def key(self, name: str, *args: str) -> str:
        self.secrets[name] = json.loads(self.cli("keys", "create", name, *args, "--json").stdout)["secret"]
        return self.secrets[name]

    def openai(self, name: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=self.secrets[name], max_retries=0, timeout=180)

    def raw_chat(self, name: str, content: str, **extra: Any) -> tuple[httpx2.Response, dict[str, Any]]:
        """The whole answer as the engine's JSON (with llama-server's `timings`), through the gateway."""
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 1,
                "temperature": 0, **extra.pop("body", {})}
        r = httpx2.post(f"{self.base}/v1/chat/completions", json=body, timeout=180, trust_env=False,
                        headers={"Authorization": f"Bearer {self.secrets[name]}", **extra.pop("headers", {})})
        assert r.status_code == 200, r.text
        return r, r.json()

    def events(self, *types: str) -> list[dict[str, Any]]:
        return read_events(self.home, *types)

    def trace(self, trace_id: str, last: str) -> list[dict[str, Any]]:
        def got() -> list[dict[str, Any]] | None:
            evs = [e for e in self.events() if e["trace_id"] == trace_id]
            return evs if any(e["type"] == last for e in evs) else None
        return wait_for(got, f"{last} of {trace_id}", timeout=30)


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Tenants]:
    home = tmp_path_factory.mktemp("tenants-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 2048, "slots": 1, "keep_alive": "10m"}) \
            as (port, _):
        t = Tenants(home, port)
        t.key("root", "--admin")
        t.key("alice")
        t.key("mallory")
        t.key("team-a", "--cache-group", "team")
        t.key("team-b", "--cache-group", "team")
        t.key("vip", "--may-prioritize")
        t.key("meter", "--daily-tokens", "20")
        # A full sliding-window cache (what sessions get) lets the engine reuse any common prefix, not only a
        # prompt that extends the cached one whole: the strongest signal a guess could get.
        t.cli("load", MODEL, "--sessions")
        yield t


def cached(answer: dict[str, Any]) -> int:
    return int((answer.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def test_another_keys_guess_at_a_prompt_gets_no_signal(tenants: Tenants) -> None:
    _, first = tenants.raw_chat("alice", SECRET)
    _, again = tenants.raw_chat("alice", SECRET)
    assert cached(again) > first["usage"]["prompt_tokens"] // 2  # her own repeat reuses her prefix
    results = {}
    for guess, text in (("whole", WHOLE_GUESS), ("right", RIGHT_GUESS), ("wrong", WRONG_GUESS)):
        tenants.raw_chat("alice", SECRET)  # the one slot holds her prompt again before each guess
        _, answer = tenants.raw_chat("mallory", text)
        results[guess] = answer
    for guess, answer in results.items():
        # Nothing of Alice's prompt was reused: no cached tokens, and the engine evaluated the whole prompt.
        assert cached(answer) == 0, (guess, answer["usage"])
        assert answer["timings"]["cache_n"] == 0, (guess, answer["timings"])
        assert answer["timings"]["prompt_n"] == answer["usage"]["prompt_tokens"], (guess, answer["timings"])
    # The same in the Anthropic dialect (cache_read_input_tokens).
    tenants.raw_chat("alice", SECRET)
    msg = anthropic.Anthropic(base_url=tenants.base, api_key=tenants.secrets["mallory"], max_retries=0,
                              timeout=180).messages.create(model=MODEL, max_tokens=1,
                                                           messages=[{"role": "user", "content": WHOLE_GUESS}])
    assert not msg.usage.cache_read_input_tokens


def test_keys_an_admin_put_in_one_cache_group_share_their_prefixes(tenants: Tenants) -> None:
    # The signal the test above looks for is real: within a cache group a right guess does reuse.
    tenants.raw_chat("team-a", SECRET)
    _, answer = tenants.raw_chat("team-b", RIGHT_GUESS)
    assert cached(answer) > 20 and answer["timings"]["cache_n"] > 20


def test_two_keys_sessions_of_one_name_never_meet(tenants: Tenants) -> None:
    history = [{"role": "user", "content": "Remember the word marmalade. " * 8}]
    r1 = tenants.openai("alice").chat.completions.with_raw_response.create(
        model=MODEL, messages=history, max_tokens=2, extra_headers={"X-Blazar-Session": "chat-1"})  # type: ignore[arg-type]
    r2 = tenants.openai("mallory").chat.completions.with_raw_response.create(
        model=MODEL, messages=history, max_tokens=2, extra_headers={"X-Blazar-Session": "chat-1"})  # type: ignore[arg-type]
    placed = {t: next(e["data"] for e in tenants.trace(t, "request.completed") if e["type"] == "request.placed")
              for t in (r1.headers["x-blazar-trace-id"], r2.headers["x-blazar-trace-id"])}
    mine, theirs = placed[r1.headers["x-blazar-trace-id"]], placed[r2.headers["x-blazar-trace-id"]]
    assert mine["session"] == "key:alice/chat-1" and theirs["session"] == "key:mallory/chat-1"
    assert theirs["kv"] == "cold" and theirs["reason"] == "the session's first turn"  # not warm on Alice's slot
    # Each key lists its own session only, by the name it gave; an admin sees both, with their owners.
    for name in ("alice", "mallory"):
        r = httpx2.get(f"{tenants.base}/api/blazar/sessions", timeout=30, trust_env=False,
                       headers={"Authorization": f"Bearer {tenants.secrets[name]}"})
        assert r.status_code == 200, r.text
        assert [(s["name"], s["tenant"]) for s in r.json()["sessions"]] == [("chat-1", f"key:{name}")]
    r = httpx2.get(f"{tenants.base}/api/blazar/sessions/chat-1?key=alice", timeout=30, trust_env=False,
                   headers={"Authorization": f"Bearer {tenants.secrets['mallory']}"})
    assert r.status_code == 403
    listed = json.loads(tenants.cli("session", "list", "--json").stdout)["sessions"]
    assert sorted((s["name"], s["tenant"]) for s in listed) >= [("chat-1", "key:alice"), ("chat-1", "key:mallory")]
    shown = json.loads(tenants.cli("session", "show", "chat-1", "--key", "alice", "--json").stdout)
    assert shown["session"] == "key:alice/chat-1" and shown["turns"] == 1
    # Mallory removing "her" chat-1 removes hers, not Alice's.
    r = httpx2.delete(f"{tenants.base}/api/blazar/sessions/chat-1", timeout=30, trust_env=False,
                      headers={"Authorization": f"Bearer {tenants.secrets['mallory']}"})
    assert r.status_code == 200 and r.json()["tenant"] == "key:mallory"
    assert json.loads(tenants.cli("session", "show", "chat-1", "--key", "alice", "--json").stdout)["turns"] == 1


def test_identical_requests_share_a_generation_only_within_one_key(tenants: Tenants) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count from one to fifty in words."}],
            "max_tokens": 48, "temperature": 0}
    answers: dict[str, httpx2.Response] = {}

    def ask(label: str, key: str) -> None:
        answers[label] = httpx2.post(f"{tenants.base}/v1/chat/completions", json=body, timeout=180, trust_env=False,
                                     headers={"Authorization": f"Bearer {tenants.secrets[key]}"})

    for pair in ((("a1", "alice"), ("m1", "mallory")), (("a2", "alice"), ("a3", "alice"))):
        threads = [threading.Thread(target=ask, args=who) for who in pair]
        threads[0].start()
        time.sleep(0.3)  # the second arrives while the first generates (48 tokens take well over a second here)
        threads[1].start()
        for t in threads:
            t.join(timeout=200)
    assert all(r.status_code == 200 for r in answers.values())
    # Mallory's request led a generation of its own: she never learns that Alice asked the same.
    assert answers["a1"].headers["x-blazar-shared"] == answers["m1"].headers["x-blazar-shared"] == "leader"
    assert answers["a3"].headers.get("x-blazar-shared") == "follower"


def test_priority_and_deadlines_are_honoured_only_for_a_key_given_the_right(tenants: Tenants) -> None:
    r, _ = tenants.raw_chat("alice", "Hello", headers={"X-Blazar-Priority": "high", "X-Blazar-Deadline-Ms": "60000"})
    assert r.headers["x-blazar-ignored"].startswith("X-Blazar-Priority, X-Blazar-Deadline-Ms")
    received = next(e["data"] for e in tenants.trace(r.headers["x-blazar-trace-id"], "request.completed")
                    if e["type"] == "request.received")
    assert received["priority"] == 0 and received["deadline_ms"] is None
    r, _ = tenants.raw_chat("vip", "Hello", headers={"X-Blazar-Priority": "high"})
    assert "x-blazar-ignored" not in r.headers
    received = next(e["data"] for e in tenants.trace(r.headers["x-blazar-trace-id"], "request.completed")
                    if e["type"] == "request.received")
    assert received["priority"] == 10
    r, _ = tenants.raw_chat("alice", "Hello", headers={"X-Blazar-Priority": "low"})
    assert "x-blazar-ignored" not in r.headers  # going behind others is anyone's choice


def test_tokens_streamed_before_a_hang_up_are_charged(tenants: Tenants) -> None:
    body = {"model": MODEL, "stream": True, "max_tokens": 200, "temperature": 0,
            "messages": [{"role": "user", "content": "Count from one to one hundred: one, two, three,"}]}
    headers = {"Authorization": f"Bearer {tenants.secrets['meter']}"}
    events = 0
    with httpx2.stream("POST", f"{tenants.base}/v1/chat/completions", json=body, headers=headers, timeout=180,
                       trust_env=False) as r:
        assert r.status_code == 200
        trace = r.headers["x-blazar-trace-id"]
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events >= 30:
                break  # hang up, well past the key's 20 tokens a day
    failed = next(e["data"] for e in tenants.trace(trace, "request.failed") if e["type"] == "request.failed")
    assert failed["reason"] == "client_disconnected" and failed["completion_tokens"] >= 29
    with pytest.raises(openai.RateLimitError) as e:
        tenants.openai("meter").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                        max_tokens=1)
    assert "daily_tokens" in str(e.value)
    shown = wait_for(lambda: (k := json.loads(tenants.cli("keys", "show", "meter", "--json").stdout))
                     ["tokens_today"] >= 29 and k, "the log's count of meter's tokens", timeout=30)
    assert shown["tokens_today"] >= 29


FLOOD = 10
HOLD_TOKENS = 1500  # the blocker's stream: far longer than the queueing it covers, and it ends when closed


def test_a_key_that_floods_the_slot_does_not_starve_another(tenants: Tenants) -> None:
    """Key `flood` holds the one slot with a stream and sends 10 more requests, which all queue; key `light` sends
    one once they wait. When the stream is closed (its slot freed), the light key's turn comes next (the flood's
    request in the slot was charged to the flood's share), ahead of every flood request still waiting, and `why`
    tells a flood request that waited for the light key's share. Asserted on the events. The slot is held until the
    test lets it go, so what queues does not depend on how fast the engine is."""
    tenants.key("flood")
    tenants.key("light", "--weight", "2")  # its share is twice the flood's; one request needs no more than its turn

    def ask(name: str, i: int) -> str:
        r = tenants.openai(name).chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"Tell me a story about the number {i}."}],
            max_tokens=4, temperature=0)
        assert r.parse().choices
        return str(r.headers["x-blazar-trace-id"])

    def queued(actor: str) -> list[dict[str, Any]]:
        return [e for e in tenants.events("request.queued") if e["actor"] == actor]

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Go on"}], "max_tokens": HOLD_TOKENS,
            "stream": True, "ignore_eos": True}
    with httpx2.stream("POST", f"{tenants.base}/v1/chat/completions", json=body, timeout=180, trust_env=False,
                       headers={"Authorization": f"Bearer {tenants.secrets['flood']}"}) as hold, \
            ThreadPoolExecutor(max_workers=FLOOD + 1) as pool:
        assert hold.status_code == 200, hold.read()
        held = hold.iter_raw()  # NOTE: kept: a dropped iterator closes the stream (a hang-up)
        next(held)  # the blocker holds the slot: it streams until closed
        floods = [pool.submit(ask, "flood", i) for i in range(FLOOD)]
        wait_for(lambda: len(queued("key:flood")) >= FLOOD, "the flood's requests queued", timeout=60)
        light_future = pool.submit(ask, "light", 0)
        wait_for(lambda: queued("key:light"), "the light key's request queued", timeout=60)
        hold.close()  # the client hangs up: the engine request is cancelled and the slot freed
        light_trace = light_future.result(timeout=180)
        flood_traces = [f.result(timeout=180) for f in floods]
    light = tenants.trace(light_trace, "request.completed")
    light_queued = next((e for e in light if e["type"] == "request.queued"), None)
    assert light_queued is not None, "the light key's request was not queued: the flood had drained already"
    assert light_queued["data"]["position"] == 1
    light_admitted = next(e for e in light if e["type"] == "request.admitted")["seq"]
    flood_admitted = [next(e for e in tenants.trace(t, "request.completed") if e["type"] == "request.admitted")
                      for t in flood_traces]
    # The flood's requests waiting when the light one queued (depth - 1 of them) were all admitted after it, each
    # passed by it; a FIFO queue would have served the light key last.
    behind = light_queued["data"]["depth"] - 1
    assert behind >= 1, "no flood request was still waiting when the light key's queued"
    passed = [a for a in flood_admitted if a["data"]["share_wait"] is not None]
    assert len(passed) == behind
    assert all(a["seq"] > light_admitted for a in passed)
    assert all(a["data"]["share_wait"] == {"ahead_other_tenants": 1, "tenant_weight": 1} for a in passed)
    told = json.loads(tenants.cli("why", passed[-1]["trace_id"], "--json").stdout)
    admitted = next(step["text"] for step in told["steps"] if step["type"] == "request.admitted")
    assert "it waited for other keys' fair share of the slots: 1 request of other keys" in admitted
    assert "went first by fair share" in told["verdict"]
    shown = json.loads(tenants.cli("keys", "limits", "flood", "--weight", "3", "--json").stdout)
    assert (shown["weight"], shown["changed"]) == (3, True)
    assert json.loads(tenants.cli("keys", "show", "light", "--json").stdout)["weight"] == 2
    refused = tenants.cli("keys", "limits", "flood", "--weight", "0", check=False)
    assert refused.returncode == 2 and "--weight" in refused.stderr
