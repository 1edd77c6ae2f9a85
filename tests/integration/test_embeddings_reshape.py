"""Embeddings without reload churn, end to end: the official `ollama` SDK alternates chat at a large `num_ctx` with
embeddings, as LlamaIndex's Ollama client does, against `blazar serve` with the real llama-server and Gemma 3 270M
(the default context is smaller than the chat's). The first embeddings request reloads the chat instance once, with
its context kept and the embeddings endpoint on; after that every request is served by that instance: the log shows
no more loads and no more evictions."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest

from tests.support.blazar_home import read_events
from tests.support.serving import serving_gemma

MODEL = "gemma"
DEFAULT_CTX = 1024
CHAT_CTX = 4096
TURNS = 4


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path
           ) -> Iterator[tuple[Path, str, subprocess.Popen]]:
    home = tmp_path_factory.mktemp("embed-reshape-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": DEFAULT_CTX}) as (port, proc):
        yield home, f"http://127.0.0.1:{port}", proc


def test_alternating_chat_at_a_large_context_and_embeddings_reloads_once(
        daemon: tuple[Path, str, subprocess.Popen]) -> None:
    home, base, _ = daemon
    client = ollama.Client(host=base, timeout=120, trust_env=False)
    for _ in range(TURNS):
        chat = client.chat(model=MODEL, messages=[{"role": "user", "content": "Once upon a time"}],
                           options={"num_ctx": CHAT_CTX, "num_predict": 4})
        assert chat.message is not None and chat.done
        emb = client.embed(model=MODEL, input=["hello world", "good night"])
        assert len(emb.embeddings) == 2 and len(emb.embeddings[0]) == 640
    starting = [e["data"] for e in read_events(home, "instance.starting")]
    evicted = [e["data"] for e in read_events(home, "instance.evicted")]
    # The chat's instance, then the one that took over from it for the first embeddings request: at the chat's
    # context (not back at the default), with the embeddings endpoint on. Nothing after that.
    assert len(starting) == 2, [(s["ctx_tokens"], s["argv"]) for s in starting]
    assert [s["ctx_tokens"] for s in starting] == [CHAT_CTX, CHAT_CTX]
    assert "--embeddings" not in starting[0]["argv"] and "--embeddings" in starting[1]["argv"]
    assert [(e["instance_id"], e["reason"]) for e in evicted] == [(starting[0]["instance_id"], "reshape")]
    # Every request after the first two ran on that one instance.
    routed = [e["data"]["instance_id"] for e in read_events(home, "request.routed")]
    assert len(routed) == 2 * TURNS and set(routed[1:]) == {starting[1]["instance_id"]}
