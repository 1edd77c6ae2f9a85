"""Hostile input against a real `blazar serve` (on the fake engine: no case here needs a real model's tokens): each
reproduction from the security review is a clear 4xx in the caller's dialect, costs the log nothing it should not,
and every request that was recorded as received ends with exactly one terminal event."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2
import ollama
import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.fake_serving import FakeDaemon, serving_fake
from tests.support.serving import blazar_cli

MODEL = "tiny"
TERMINAL = {"request.completed", "request.failed", "request.rejected"}


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, FakeDaemon]]:
    home = tmp_path_factory.mktemp("hostile-home")
    files = tmp_path_factory.mktemp("hostile-files")
    with serving_fake(home, files, MODEL) as daemon:
        yield home, daemon


def _http(daemon: FakeDaemon) -> httpx2.Client:
    return httpx2.Client(base_url=daemon.base, trust_env=False, timeout=30)


def _nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = {"a": [value]}
    return value


def _db_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in home.glob("blazar.db*"))


def test_a_10_mib_model_name_is_a_short_400_that_never_reaches_the_log(fake) -> None:
    home, daemon = fake
    name = "m" * (10 << 20)
    before = _db_bytes(home)
    with _http(daemon) as c:
        for path, body in (("/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "x"}]}),
                           ("/api/chat", {"model": name, "messages": [{"role": "user", "content": "x"}]}),
                           ("/v1/messages", {"model": name, "max_tokens": 4,
                                             "messages": [{"role": "user", "content": "x"}]})):
            r = c.post(path, json=body)
            assert r.status_code == 400, (path, r.text[:300])
            assert len(r.content) < 2000
    assert _db_bytes(home) - before < 64 << 10


@pytest.mark.parametrize("case", ["openai_content", "openai_prompt", "anthropic_tool_use", "ollama_tool_calls",
                                  "response_format", "ollama_format", "tool_parameters", "anthropic_input_schema"])
def test_deep_nesting_is_a_400_in_the_callers_dialect(fake, case: str) -> None:
    _, daemon = fake
    deep = _nested(300)
    path, body = {
        "openai_content": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "x", "extra": deep}]}]}),
        "openai_prompt": ("/v1/completions", {"model": MODEL, "prompt": [deep]}),
        "anthropic_tool_use": ("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": deep}]}]}),
        "ollama_tool_calls": ("/api/chat", {"model": MODEL, "stream": False, "messages": [
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": deep}}]}]}),
        "response_format": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                     "response_format": {"type": "json_schema", "json_schema": {
                                                         "name": "s", "schema": _nested(200)}}}),
        "tool_parameters": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                     "tools": [{"type": "function", "function": {
                                                         "name": "f", "parameters": _nested(200)}}]}),
        "anthropic_input_schema": ("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": [
            {"role": "user", "content": "x"}], "tools": [{"name": "f", "input_schema": _nested(200)}]}),
        "ollama_format": ("/api/generate", {"model": MODEL, "prompt": "x", "stream": False, "format": _nested(200)}),
    }[case]
    with _http(daemon) as c:
        r = c.post(path, json=body)
    assert r.status_code == 400, r.text[:300]
    data = r.json()
    if path.startswith("/api/"):
        assert "nests deeper" in data["error"]
    elif path == "/v1/messages":
        assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    else:
        assert "nests deeper" in data["error"]["message"]


@pytest.mark.parametrize("keep_alive", [1e30, 1e300, 2**63 - 1, "99999999999999h"])
def test_an_absurd_keep_alive_is_a_400_and_ps_stays_healthy(fake, keep_alive: object) -> None:
    _, daemon = fake
    with _http(daemon) as c:
        r = c.post("/api/generate", json={"model": MODEL, "keep_alive": keep_alive})
        assert r.status_code == 400, r.text[:300]
        load = c.post("/api/blazar/load", json={"model": MODEL, "keep_alive": keep_alive})
        assert load.status_code == 400
        assert c.get("/api/ps").status_code == 200


def test_an_unknown_role_is_a_400_in_every_dialect(fake) -> None:
    _, daemon = fake
    oa = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="role"):
        oa.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "hi"}])  # type: ignore[misc]
    an = anthropic.Anthropic(base_url=daemon.base, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="role"):
        an.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "wizard", "content": "hi"}])  # type: ignore
    ol = ollama.Client(host=daemon.base)
    with pytest.raises(ollama.ResponseError) as e:
        ol.chat(model=MODEL, messages=[{"role": "wizard", "content": "hi"}])
    assert e.value.status_code == 400 and "role" in str(e.value)


def test_booleans_and_integers_are_strict(fake) -> None:
    _, daemon = fake
    with _http(daemon) as c:
        assert c.post("/api/blazar/load", json={"model": MODEL, "pin": "yes"}).status_code == 400
        assert c.post("/api/blazar/load", json={"model": MODEL, "ctx": 512.0}).status_code == 400
        r = c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": True,
                                                 "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
        for bad in (True, 3.0, "3"):
            r = c.post("/api/chat", json={"model": MODEL, "stream": False, "options": {"num_predict": bad},
                                          "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 400 and "num_predict" in r.json()["error"], bad


def test_a_10_mib_name_on_the_model_management_routes_is_a_short_400(fake) -> None:
    home, daemon = fake
    name = "m" * (10 << 20)
    before = _db_bytes(home)
    with _http(daemon) as c:
        for method, path, body in (("POST", "/api/show", {"model": name}), ("DELETE", "/api/delete", {"model": name}),
                                   ("POST", "/api/copy", {"source": MODEL, "destination": name}),
                                   ("POST", "/api/pull", {"model": name, "stream": False}),
                                   ("POST", "/api/blazar/load", {"model": name}),
                                   ("POST", "/v1/embeddings", {"model": name, "input": "x"})):
            r = c.request(method, path, json=body)
            assert r.status_code == 400 and len(r.content) < 2000, (path, r.text[:300])
    assert _db_bytes(home) - before < 64 << 10


def test_a_load_only_request_checks_the_name_too(fake) -> None:
    _, daemon = fake
    with _http(daemon) as c:
        for path in ("/api/chat", "/api/generate"):
            r = c.post(path, json={"model": "tiny\n", "messages": [], "stream": False})
            assert r.status_code == 400 and "invalid model name" in r.json()["error"], (path, r.text)


def test_a_reused_trace_id_gets_a_fresh_one_and_the_old_trace_is_untouched(fake) -> None:
    home, daemon = fake
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with _http(daemon) as c:
        first = c.post("/v1/chat/completions", json=body, headers={"x-blazar-trace-id": "reused-trace-0001"})
        assert first.status_code == 200 and first.headers["x-blazar-trace-id"] == "reused-trace-0001"
        second = c.post("/v1/chat/completions", json=body, headers={"x-blazar-trace-id": "reused-trace-0001"})
        assert second.status_code == 200
        fresh = second.headers["x-blazar-trace-id"]
    assert fresh != "reused-trace-0001"
    blazar_cli(home, "why", fresh)  # the second request is its own trace
    events = read_events(home, "request.received")
    old = [e for e in events if e["trace_id"] == "reused-trace-0001"]
    new = [e for e in events if e["trace_id"] == fresh]
    assert len(old) == 1
    assert len(new) == 1 and new[0]["data"]["client_trace_id"] == "reused-trace-0001"


def test_a_model_name_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    from blazar.adapters.engines.tiny_model import write_tiny_model

    gguf = write_tiny_model(tmp_path / "t.gguf")
    proc = subprocess.run(
        [sys.executable, "-m", "blazar.cli.main", "import", str(gguf), "--name", "nl\n"],
        env={**os.environ, "BLAZAR_HOME": str(tmp_path / "home")}, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "invalid model name" in proc.stderr
    assert not list((tmp_path / "home" / "models").glob("nl*"))


def test_no_pull_lock_is_left_behind(fake) -> None:
    home, daemon = fake
    with _http(daemon) as c:
        for name in ("acme/missing-GGUF", "nosuchmodel", "other/none-GGUF:Q8_0"):
            c.post("/api/pull", json={"model": name, "stream": False})
    assert not list((home / "run").glob("pull-*.lock"))


def test_every_received_request_ended_exactly_once(fake) -> None:
    """Last in the module: whatever the cases above did, each recorded request has one terminal event."""
    home, _ = fake

    def unfinished() -> dict[str, int]:
        events = read_events(home)
        received = {e["trace_id"] for e in events if e["type"] == "request.received"}
        assert received
        ends = Counter(e["trace_id"] for e in events if e["type"] in TERMINAL)
        return {t: ends[t] for t in received if ends[t] != 1}

    deadline = time.monotonic() + 10  # request events are group-committed: the last batch may be on its way
    while unfinished() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert unfinished() == {}


def test_a_hub_path_leaving_the_download_dir_or_a_non_gguf_file_is_not_a_500(tmp_path: Path) -> None:
    from tests.support.hub_server import HubServer

    repos = {"acme/escape-GGUF": {"../escape.gguf": b"GGUF" + b"\0" * 64},
             "acme/junk-GGUF": {"junk-Q4_K_M.gguf": b"this is not a gguf file " * 64}}
    with HubServer(repos) as hub, serving_fake(tmp_path / "home", tmp_path / "files", MODEL,
                                               env={"HF_ENDPOINT": hub.url}) as daemon, _http(daemon) as c:
        escape = c.post("/api/pull", json={"model": "acme/escape-GGUF", "stream": False})
        junk = c.post("/api/pull", json={"model": "acme/junk-GGUF:Q4_K_M", "stream": False})
    assert escape.status_code == 502 and "leaves the download directory" in escape.json()["error"]
    assert junk.status_code == 422 and "not a GGUF file" in junk.json()["error"]
    assert not (tmp_path / "home" / "escape.gguf").exists()
    assert not list((tmp_path / "home" / "run").glob("pull-*.lock"))
