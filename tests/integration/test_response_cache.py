"""The response cache end to end: the official SDKs (openai, anthropic, ollama) against `blazar serve` with the real
llama-server and the real Gemma 3 270M, with keys (keys are tenants). A hit gives the same answer again, streamed or
whole, in the caller's dialect, without the engine: no `request.routed` or `request.admitted` in its trace, and the
engine's own token counter (`llamacpp:tokens_predicted_total`) unmoved. Never another key's; never after the model
changed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import ollama
import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
TOKENS = 4
THRESHOLD = 0.95  # routing.semantic_cache_threshold's default
ENGINE_BOUND = ("request.routed", "request.admitted")
TOLD = ("request.received", "request.cache_hit", *ENGINE_BOUND, "request.completed", "request.failed")


class Cached:
    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.base = f"http://127.0.0.1:{port}"
        self.secrets: dict[str, str] = {}
        self._metrics: tuple[str, dict[str, str]] | None = None  # the instance's /metrics URL and its key

    def cli(self, *args: str) -> Any:
        return blazar_cli(self.home, *args)

    def openai(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=self.secrets[key], max_retries=0, timeout=120)

    def anthropic(self, key: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.base, api_key=self.secrets[key], max_retries=0, timeout=120)

    def ollama(self, key: str, seen: list[Any]) -> ollama.Client:
        return ollama.Client(host=self.base, timeout=120, trust_env=False,
                             headers={"Authorization": f"Bearer {self.secrets[key]}"},
                             event_hooks={"response": [lambda r: seen.append(r.headers)]})

    def trace(self, trace: str) -> list[str]:
        """The trace's event types, once its request ended (request events are group-committed)."""
        def ended() -> list[str] | None:
            types = [e["type"] for e in read_events(self.home, *TOLD) if e["trace_id"] == trace]
            return types if {"request.completed", "request.failed"} & set(types) else None
        return wait_for(ended, f"the end of {trace}", timeout=30)

    def engine_tokens(self) -> int:
        """Tokens the model's llama-server child has generated so far, from its own /metrics (with its own key; the
        instance found once: the tests that read it never reload the model)."""
        if self._metrics is None:
            ps = json.loads(self.cli("ps", "--json").stdout)
            inst = next(i for i in ps["instances"] if i["model"] == MODEL)
            key = (self.home / "run" / "instances" / f"{inst['instance_id']}.key").read_text().strip()
            self._metrics = (f"http://127.0.0.1:{inst['port']}/metrics", {"Authorization": f"Bearer {key}"})
        url, headers = self._metrics
        text = httpx2.get(url, headers=headers, timeout=10).text
        return int(float(next(line.split()[-1] for line in text.splitlines()
                              if line.startswith("llamacpp:tokens_predicted_total"))))


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Cached]:
    home = tmp_path_factory.mktemp("cache-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024, "slots": 2, "keep_alive": "10m"}) as (
            port, _):
        c = Cached(home, port)
        for name, args in (("alice", ("--cache", "exact")), ("bob", ("--cache", "exact")), ("carol", ())):
            c.secrets[name] = json.loads(c.cli("keys", "create", name, *args, "--json").stdout)["secret"]
        c.cli("load", MODEL)
        yield c


# -- one ask per dialect: (answer text, the response's headers) ------------------------------------------------------

def _openai(c: Cached, key: str, prompt: str, stream: bool, headers: dict[str, str]) -> tuple[str, Any]:
    raw = c.openai(key).chat.completions.with_raw_response.create(  # type: ignore[call-overload]
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=TOKENS, temperature=0,
        stream=stream, extra_headers=headers)
    if stream:
        return "".join(ch.choices[0].delta.content or "" for ch in raw.parse() if ch.choices), raw.headers
    return raw.parse().choices[0].message.content or "", raw.headers


def _anthropic(c: Cached, key: str, prompt: str, stream: bool, headers: dict[str, str]) -> tuple[str, Any]:
    raw = c.anthropic(key).messages.with_raw_response.create(  # type: ignore[call-overload]
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=TOKENS,
        extra_body={"temperature": 0}, stream=stream, extra_headers=headers)  # this SDK no longer names temperature
    if stream:
        text = "".join(ev.delta.text for ev in raw.parse()
                       if ev.type == "content_block_delta" and ev.delta.type == "text_delta")
        return text, raw.headers
    return "".join(b.text for b in raw.parse().content if b.type == "text"), raw.headers


def _ollama_chat(c: Cached, key: str, prompt: str, stream: bool, headers: dict[str, str]) -> tuple[str, Any]:
    seen: list[Any] = []
    client = c.ollama(key, seen)
    client._client.headers.update(headers)
    got = client.chat(model=MODEL, messages=[{"role": "user", "content": prompt}], stream=stream,
                      options={"num_predict": TOKENS, "temperature": 0})
    text = "".join(p.message.content or "" for p in got) if stream else got.message.content or ""
    return text, seen[-1]


def _ollama_generate(c: Cached, key: str, prompt: str, stream: bool, headers: dict[str, str]) -> tuple[str, Any]:
    seen: list[Any] = []
    client = c.ollama(key, seen)
    client._client.headers.update(headers)
    got = client.generate(model=MODEL, prompt=prompt, stream=stream, options={"num_predict": TOKENS, "seed": 7})
    text = "".join(p.response for p in got) if stream else got.response
    return text, seen[-1]


ASK: dict[str, Callable[[Cached, str, str, bool, dict[str, str]], tuple[str, Any]]] = {
    "openai-chat": _openai, "anthropic-messages": _anthropic, "ollama-chat": _ollama_chat,
    "ollama-generate": _ollama_generate,
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("dialect", list(ASK))
def test_an_exact_hit_gives_the_same_answer_without_the_engine(cached: Cached, dialect: str, stream: bool) -> None:
    prompt = f"The sea is ({dialect}, {'streamed' if stream else 'whole'})"
    first, h1 = ASK[dialect](cached, "alice", prompt, stream, {})
    assert h1["x-blazar-cache"] == "miss" and first
    assert set(ENGINE_BOUND) <= set(cached.trace(h1["x-blazar-trace-id"]))
    before = cached.engine_tokens()
    again, h2 = ASK[dialect](cached, "alice", prompt, stream, {})
    assert again == first
    assert h2["x-blazar-cache"].startswith("hit; age=")
    hit = cached.trace(h2["x-blazar-trace-id"])
    assert "request.cache_hit" in hit and "request.completed" in hit
    assert not set(ENGINE_BOUND) & set(hit)  # no route, no slot: the engine was not asked
    assert cached.engine_tokens() == before


def test_a_hit_is_never_another_keys_and_refresh_runs_the_engine_again(cached: Cached) -> None:
    prompt = "Name a colour of the sea, key by key"
    first, h = _openai(cached, "alice", prompt, False, {})
    assert h["x-blazar-cache"] == "miss"
    before = cached.engine_tokens()
    theirs, h_bob = _openai(cached, "bob", prompt, False, {})  # bob's tenant has no entry for it: the engine runs
    assert h_bob["x-blazar-cache"] == "miss" and theirs == first
    assert "request.cache_hit" not in cached.trace(h_bob["x-blazar-trace-id"])
    assert cached.engine_tokens() > before
    # carol has no setting: no cache unless she asks for it, and then her own entry
    _, h_carol = _openai(cached, "carol", prompt, False, {})
    assert "x-blazar-cache" not in h_carol
    _, h_carol = _openai(cached, "carol", prompt, False, {"X-Blazar-Cache": "use"})
    assert h_carol["x-blazar-cache"] == "miss"
    _, h_carol = _openai(cached, "carol", prompt, False, {"X-Blazar-Cache": "use"})
    assert h_carol["x-blazar-cache"].startswith("hit")
    # refresh: the engine again, the entry replaced; off: the cache bypassed
    _, h_refresh = _openai(cached, "alice", prompt, False, {"X-Blazar-Cache": "refresh"})
    assert h_refresh["x-blazar-cache"] == "refresh"
    assert set(ENGINE_BOUND) <= set(cached.trace(h_refresh["x-blazar-trace-id"]))
    _, h_off = _openai(cached, "alice", prompt, False, {"X-Blazar-Cache": "off"})
    assert "x-blazar-cache" not in h_off
    _, h_hit = _openai(cached, "alice", prompt, False, {})
    assert h_hit["x-blazar-cache"].startswith("hit")
    why = cached.cli("why", h_hit["x-blazar-trace-id"]).stdout
    assert "answered from the response cache (exact)" in why


def test_a_malformed_cache_header_is_a_400_in_the_callers_dialect(cached: Cached) -> None:
    with pytest.raises(openai.BadRequestError) as o:
        _openai(cached, "alice", "hi", False, {"X-Blazar-Cache": "sometimes"})
    assert "X-Blazar-Cache" in o.value.message
    with pytest.raises(anthropic.BadRequestError) as a:
        _anthropic(cached, "alice", "hi", False, {"X-Blazar-Cache": "sometimes"})
    assert a.value.body["type"] == "error" and "X-Blazar-Cache" in a.value.message  # type: ignore[index]


def test_after_the_model_changed_the_same_request_misses(cached: Cached) -> None:
    prompt = "The sea, before and after"
    _, h = _openai(cached, "alice", prompt, False, {})
    _, h = _openai(cached, "alice", prompt, False, {})
    assert h["x-blazar-cache"].startswith("hit")
    cached.cli("model", "set", MODEL, "--template", "chatml")  # another template: another answer may come
    _, h = _openai(cached, "alice", prompt, False, {})
    assert h["x-blazar-cache"] == "miss"
    assert set(ENGINE_BOUND) <= set(cached.trace(h["x-blazar-trace-id"]))


def test_a_similar_prompt_is_a_semantic_hit_of_the_same_key_only(cached: Cached) -> None:
    # Last in this module: the first embedding reloads the model's instance with the embeddings endpoint on.
    cached.cli("config", "set", "routing.semantic_cache_model", MODEL)  # the demo model embeds as well as it chats
    for name in ("dave", "erin"):
        cached.secrets[name] = json.loads(cached.cli("keys", "create", name, "--cache", "semantic", "--json").stdout)[
            "secret"]
    first, h = _openai(cached, "dave", "Name one colour of the deep blue sea.", False, {})
    assert h["x-blazar-cache"].startswith("miss") and first
    again, h = _openai(cached, "dave", "Name one colour of the deep blue sea!", False, {})
    print("similar:", h["x-blazar-cache"])
    assert h["x-blazar-cache"].startswith("hit-semantic; similarity=") and again == first
    trace = h["x-blazar-trace-id"]
    assert "request.cache_hit" in cached.trace(trace) and not set(ENGINE_BOUND) & set(cached.trace(trace))
    [hit] = [e["data"] for e in read_events(cached.home, "request.cache_hit") if e["trace_id"] == trace]
    assert hit["source"] == "semantic" and THRESHOLD <= hit["similarity"] <= 1
    assert "answered from the response cache (semantic, similarity" in cached.cli("why", trace).stdout
    _, h = _openai(cached, "erin", "Name one colour of the deep blue sea!", False, {})  # another key: its own
    print("other key:", h["x-blazar-cache"])
    assert h["x-blazar-cache"].startswith("miss")
    _, h = _openai(cached, "dave", "Count from one to five: one, two,", False, {})  # another question
    print("dissimilar:", h["x-blazar-cache"])
    assert h["x-blazar-cache"].startswith("miss; semantic=")
    assert set(ENGINE_BOUND) <= set(cached.trace(h["x-blazar-trace-id"]))
    assert "not answered from the semantic cache" in cached.cli("why", h["x-blazar-trace-id"]).stdout
