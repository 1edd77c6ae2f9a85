"""Rerank end to end (/v1/rerank and /rerank, Jina's and Cohere's shape) against `blazar serve` with the real
llama-server, through the official `openai` SDK's own request method (it has no rerank resource; its client, its
auth and its error types are what a caller of these routes uses).

The packaged Gemma 3 270M has no rerank head: it is refused with a clear 400 until `blazar model set gemma --rerank`
forces rerank mode, and then the whole path runs on the real engine (llama-server --reranking). Its scores mean
nothing; the shape, the order, top_n, the documents and the usage are real, and so are the trace and the instance
in rerank mode beside the chat one. The scoring path itself runs on a tiny reranker written at test time
(tests/support/tiny_reranker.py: bert, pooling type rank, a classifier head), which needs no setting at all."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import ollama
import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma
from tests.support.tiny_reranker import write_tiny_reranker

MODEL = "gemma"
RERANKER = "tiny-reranker"
QUERY = "Which animal is a bear that eats bamboo?"
DOCS = ["The giant panda eats bamboo.", "Paris is the capital of France.", "Tea is a drink.",
        "The stock market fell today."]


class Daemon:
    def __init__(self, home: Path, port: int, proc: subprocess.Popen) -> None:
        self.home, self.port, self.proc = home, port, proc
        self.base = f"http://127.0.0.1:{port}"

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=120)

    def rerank(self, body: dict[str, Any], path: str = "/rerank") -> Any:
        """POST `body` to /v1`path` through the SDK; its parsed JSON answer."""
        return self.client().post(path, cast_to=object, body=body)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("rerank-home")
    gguf = write_tiny_reranker(tmp_path_factory.mktemp("reranker") / "tiny-reranker.gguf")
    blazar_cli(home, "import", str(gguf), "--name", RERANKER)
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024, "slots": 2}) as (port, proc):
        yield Daemon(home, port, proc)


def test_a_model_without_a_rerank_head_is_refused_with_what_it_can_do(daemon: Daemon) -> None:
    assert "rerank" not in capabilities(daemon, MODEL)
    with pytest.raises(openai.BadRequestError) as e:
        daemon.rerank({"model": MODEL, "query": QUERY, "documents": DOCS})
    message = e.value.body["message"] if isinstance(e.value.body, dict) else str(e.value.body)
    assert "gemma cannot rerank" in message and "no rerank head" in message and "completion" in message
    assert "blazar model set gemma --rerank" in message
    # Nothing was loaded for it, and the refusal is a decision in the log.
    assert not [e for e in read_events(daemon.home, "instance.starting")]
    rejected = wait_for(lambda: read_events(daemon.home, "request.rejected"), "request.rejected")
    assert rejected[-1]["data"]["status"] == 400 and rejected[-1]["data"]["reason"] == "invalid_request"


def test_bad_rerank_bodies_are_400_in_openais_shape(daemon: Daemon) -> None:
    for body in ({"model": MODEL, "query": QUERY, "documents": []},
                 {"model": MODEL, "documents": DOCS},
                 {"model": MODEL, "query": QUERY, "documents": [3]},
                 {"model": MODEL, "query": QUERY, "documents": DOCS, "top_n": 0}):
        r = httpx2.post(f"{daemon.base}/v1/rerank", json=body, trust_env=False, timeout=120)
        assert r.status_code == 400, body
        assert isinstance(r.json()["error"]["message"], str)
    with pytest.raises(openai.NotFoundError):
        daemon.rerank({"model": "nosuch", "query": QUERY, "documents": DOCS})


def test_forced_rerank_mode_ranks_through_the_real_engine(daemon: Daemon) -> None:
    blazar_cli(daemon.home, "model", "set", MODEL, "--rerank")
    shown = blazar_cli(daemon.home, "show", MODEL, "--json").stdout
    assert '"rerank"' in shown  # the capability, as `blazar show` lists it
    assert "rerank" in capabilities(daemon, MODEL)
    got = daemon.rerank({"model": MODEL, "query": QUERY, "documents": DOCS})
    assert got["model"] == MODEL and got["object"] == "list"
    results = got["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)  # best first
    assert all(r["document"] == {"text": DOCS[r["index"]]} for r in results)  # Jina's default: documents back
    assert got["usage"]["prompt_tokens"] > 0 and got["usage"]["total_tokens"] >= got["usage"]["prompt_tokens"]

    # Cohere's shape: documents as {"text": ...} objects, top_n, no documents back; at /v1/rerank too.
    top = daemon.rerank({"model": MODEL, "query": QUERY, "documents": [{"text": d} for d in DOCS], "top_n": 2,
                         "return_documents": False}, path="/rerank")
    assert len(top["results"]) == 2 and all("document" not in r for r in top["results"])
    assert [r["index"] for r in top["results"]] == [r["index"] for r in results[:2]]  # the same engine, same order
    r = httpx2.post(f"{daemon.base}/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS[:2]},
                    trust_env=False, timeout=120)
    assert r.status_code == 200 and len(r.json()["results"]) == 2 and r.headers["x-blazar-trace-id"]


def test_a_rerank_instance_serves_rerank_only_and_chat_gets_its_own(daemon: Daemon) -> None:
    daemon.rerank({"model": MODEL, "query": QUERY, "documents": DOCS[:2]})
    chat = daemon.client().completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4)
    assert chat.choices[0].text is not None
    daemon.rerank({"model": MODEL, "query": QUERY, "documents": DOCS[:2]})
    started = [e for e in read_events(daemon.home, "instance.started") if e["data"]["model"] == MODEL]
    rerank_mode = [e for e in started if "--reranking" in e["data"]["argv"]]
    plain = [e for e in started if "--reranking" not in e["data"]["argv"]]
    # One instance in rerank mode (reused by every rerank request), one for the completion beside it: neither was
    # evicted to make way for the other.
    assert len(rerank_mode) == 1 and len(plain) == 1
    assert not read_events(daemon.home, "instance.evicted")


def test_a_rerank_request_is_traced_and_counted_like_embeddings(daemon: Daemon) -> None:
    r = httpx2.post(f"{daemon.base}/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS[:3]},
                    trust_env=False, timeout=120)
    assert r.status_code == 200
    trace = r.headers["x-blazar-trace-id"]

    def done() -> list[dict]:
        evs = [e for e in read_events(daemon.home) if e["trace_id"] == trace]
        return evs if evs and evs[-1]["type"] == "request.completed" else []

    evs = wait_for(done, "request.completed")
    types = [e["type"] for e in evs]
    assert types[0] == "request.received" and "request.routed" in types and "request.admitted" in types
    assert evs[0]["data"]["route"] == "/v1/rerank"
    assert evs[-1]["data"]["prompt_tokens"] == r.json()["usage"]["prompt_tokens"] > 0


def test_a_reranker_gguf_is_scored_by_the_real_engine(daemon: Daemon) -> None:
    """A GGUF whose pooling type is rank reranks as it is: its capability shows, and the engine's classifier head
    scores each pair (the same scores every time; different documents, different scores)."""
    assert "rerank" in capabilities(daemon, RERANKER)
    docs = ["the panda eats bamboo", "paris is in france", "tea is a drink", "bears sleep in winter"]
    got = daemon.rerank({"model": RERANKER, "query": "which bear eats bamboo", "documents": docs})
    scores = {r["index"]: r["relevance_score"] for r in got["results"]}
    assert sorted(scores) == [0, 1, 2, 3] and len(set(scores.values())) == 4
    assert [r["relevance_score"] for r in got["results"]] == sorted(scores.values(), reverse=True)
    again = daemon.rerank({"model": RERANKER, "query": "which bear eats bamboo", "documents": docs[::-1],
                           "top_n": 2, "return_documents": False})
    # The same pairs score the same whatever their order in the request; top_n keeps the best two.
    assert [(3 - r["index"], r["relevance_score"]) for r in again["results"]] == \
        [(r["index"], r["relevance_score"]) for r in got["results"][:2]]
    started = [e["data"] for e in read_events(daemon.home, "instance.started") if e["data"]["model"] == RERANKER]
    assert len(started) == 1 and "--reranking" in started[0]["argv"]


def capabilities(daemon: Daemon, model: str) -> list[str]:
    """The model's capabilities as Ollama's /api/show lists them, read through the ollama SDK."""
    shown = ollama.Client(host=daemon.base, timeout=120, trust_env=False).show(model)
    return list(shown.capabilities or [])


def test_keys_apply_to_rerank_as_to_every_inference_route(daemon: Daemon) -> None:
    """Last in this module: it turns keys on. No key is a 401; a model outside the key's scope a 403; in scope, the
    answer, recorded as the key's."""
    secret = json.loads(blazar_cli(daemon.home, "keys", "create", "ranker", "--models", "tiny-*",
                                   "--json").stdout)["secret"]
    body = {"model": RERANKER, "query": "which bear eats bamboo", "documents": ["the panda eats bamboo", "tea"]}

    def client(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{daemon.base}/v1", api_key=key, max_retries=0, timeout=120)

    def refused() -> bool:
        try:
            client("none").post("/rerank", cast_to=object, body=body)
        except openai.AuthenticationError:
            return True
        return False

    wait_for(refused, "keys on")  # the daemon folds the key's event
    with pytest.raises(openai.PermissionDeniedError):
        client(secret).post("/rerank", cast_to=object, body={**body, "model": MODEL})
    got = client(secret).post("/rerank", cast_to=object, body=body)
    assert [r["index"] for r in got["results"]] and got["model"] == RERANKER
    done = wait_for(lambda: [e for e in read_events(daemon.home, "request.completed") if e["actor"] == "key:ranker"],
                    "the key's request.completed")
    assert done[-1]["data"]["prompt_tokens"] == got["usage"]["prompt_tokens"]
