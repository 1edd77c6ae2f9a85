"""The inference routes' shared resource (blazar/api/proxy.py) and the gateway's translated relay, against a fake
supervisor and a fake engine client behind the real app, gateway and admission: the decisions and the fault paths
(an engine that gives up mid-stream, bad input that must be a 400 in the caller's dialect, never a 500)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import orjson
import pytest

from blazar.api.app import create_app
from blazar.context import Blazar
from blazar.serving.admission import Admission
from blazar.serving.gateway import Gateway
from tests.support.asgi import LocalConductor as ASGIConductor
from tests.support.fakes import FakeEngine, FakeSupervisor

CHUNK = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
ENGINE_ERROR = {"error": {"code": 500, "message": "the slot died", "type": "server_error"}}


@pytest.fixture
def sup() -> FakeSupervisor:
    return FakeSupervisor()


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(events=[])


@pytest.fixture
def admission() -> Admission:
    return Admission()


@pytest.fixture
async def client(app: Blazar, sup: FakeSupervisor, engine: FakeEngine,
                 admission: Admission) -> AsyncIterator[ASGIConductor]:
    gateway = Gateway(app, sup, admission, engine)  # type: ignore[arg-type]
    async with ASGIConductor(create_app(app, sup, gateway)) as c:  # type: ignore[arg-type]
        yield c


def settled(sup: FakeSupervisor, admission: Admission) -> bool:
    return sup.held == 0 and all(int(v.get("busy", 0)) == 0 for v in admission.snapshot().values())


async def test_an_engine_error_mid_stream_ends_an_anthropic_stream_with_an_error_event(
        client: ASGIConductor, engine: FakeEngine, sup: FakeSupervisor, admission: Admission) -> None:
    engine.events = [CHUNK, ENGINE_ERROR]
    r = await client.simulate_post("/v1/messages", json={"model": "m", "max_tokens": 5, "stream": True,
                                                         "messages": [{"role": "user", "content": "x"}]})
    names = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "error" and "message_stop" not in names
    assert "the slot died" in r.text and settled(sup, admission)


async def test_an_engine_error_mid_stream_ends_an_ollama_stream_with_an_error_line(
        client: ASGIConductor, engine: FakeEngine, sup: FakeSupervisor, admission: Admission) -> None:
    engine.events = [CHUNK, ENGINE_ERROR]
    r = await client.simulate_post("/api/chat", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    lines = [orjson.loads(line) for line in r.text.splitlines()]
    assert lines[0]["message"]["content"] == "Hi" and lines[-1] == {"error": "the slot died"}
    assert not any(line.get("done") for line in lines) and settled(sup, admission)


async def test_an_openai_stream_relays_the_engines_error_event_as_it_was(
        client: ASGIConductor, engine: FakeEngine, sup: FakeSupervisor, admission: Admission) -> None:
    engine.events = [CHUNK, ENGINE_ERROR]
    r = await client.simulate_post("/v1/chat/completions", json={
        "model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    assert r.text.endswith("data: " + orjson.dumps(ENGINE_ERROR).decode() + "\n\n") and settled(sup, admission)


async def test_ollama_keep_alive_and_num_ctx_reach_the_supervisor(client: ASGIConductor, engine: FakeEngine,
                                                                  sup: FakeSupervisor) -> None:
    engine.events = [CHUNK, {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    r = await client.simulate_post("/api/generate", json={"model": "m", "prompt": "x", "keep_alive": "2m",
                                                          "options": {"num_ctx": 512, "num_predict": 3}})
    assert orjson.loads(r.text.splitlines()[-1])["done"] is True
    assert sup.ensured[-1]["ctx"] == 512 and sup.ensured[-1]["keep_alive"] == 120.0
    path, body = engine.sent[-1]
    assert path == "/v1/chat/completions" and body["max_tokens"] == 3
    assert body["stream_options"] == {"include_usage": True}


BAD_SCHEMA = {"$schema": [], "type": "object"}


@pytest.mark.parametrize(("route", "body", "words"), [
    ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "x"}], "format": BAD_SCHEMA},
     "format.$schema"),
    ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "x"}], "keep_alive": "nan"},
     "keep_alive"),
    ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "x"}], "options": {"num_predict": 1e300}},
     "options.num_predict"),
    ("/api/generate", {"model": "m", "prompt": "x", "options": {"num_ctx": 1e12}}, "options.num_ctx"),
])
async def test_bad_ollama_input_is_a_400_in_ollamas_shape(client: ASGIConductor, engine: FakeEngine, route: str,
                                                         body: dict, words: str) -> None:
    r = await client.simulate_post(route, json=body)
    assert r.status_code == 400 and list(r.json) == ["error"] and words in r.json["error"]
    assert engine.sent == []


async def test_bad_openai_and_anthropic_input_is_a_400_in_their_shapes(client: ASGIConductor,
                                                                      engine: FakeEngine) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ask = [{"role": "user", "content": "x"}]
    for choice in ({"type": "function", "function": "f"}, {"type": "function", "function": {"name": ["f"]}}):
        r = await client.simulate_post("/v1/chat/completions", json={"model": "m", "messages": ask, "tools": [tool],
                                                                     "tool_choice": choice})
        assert r.status_code == 400 and "tool_choice" in r.json["error"]["message"]
    r = await client.simulate_post("/v1/chat/completions", json={"model": "m", "messages": ask, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": BAD_SCHEMA}}})
    assert r.status_code == 400 and r.json["error"]["code"] == "invalid_schema"
    r = await client.simulate_post("/v1/messages", json={"model": "m", "max_tokens": 5, "messages": ask, "tools": [
        {"name": "f", "input_schema": BAD_SCHEMA}]})
    assert r.status_code == 400 and r.json["type"] == "error"
    assert r.json["error"]["type"] == "invalid_request_error" and "$schema" in r.json["error"]["message"]
    assert engine.sent == []


async def test_unknown_model_is_404_in_each_dialect(client: ASGIConductor) -> None:
    ask = [{"role": "user", "content": "x"}]
    r = await client.simulate_post("/api/chat", json={"model": "missing", "messages": ask})
    assert r.status_code == 404 and list(r.json) == ["error"]
    r = await client.simulate_post("/v1/messages", json={"model": "missing", "max_tokens": 3, "messages": ask})
    assert r.status_code == 404 and r.json["error"]["type"] == "not_found_error"
    r = await client.simulate_post("/v1/chat/completions", json={"model": "missing", "messages": ask})
    assert r.status_code == 404 and r.json["error"]["code"] == "model_not_found"


async def test_bad_images_are_400s_in_each_dialects_shape_before_the_engine(client: ASGIConductor,
                                                                           engine: FakeEngine) -> None:
    fake = base64.b64encode(b"%PDF-1.7 not a picture").decode()
    part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{fake}"}}
    r = await client.simulate_post("/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "user", "content": [part]}]})
    assert r.status_code == 400 and r.json["error"]["code"] == "invalid_image"
    r = await client.simulate_post("/v1/messages", json={"model": "m", "max_tokens": 3, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://example.com/a.png"}}]}]})
    assert r.status_code == 400 and r.json["type"] == "error" and "image_fetch is off" in r.json["error"]["message"]
    r = await client.simulate_post("/api/generate", json={"model": "m", "prompt": "x", "images": [
        base64.b64encode(b"\x89PNG\r\n\x1a\n truncated").decode()]})
    assert r.status_code == 400 and list(r.json) == ["error"] and "the image cannot be read" in r.json["error"]
    r = await client.simulate_post("/v1/completions", json={"model": "m", "prompt": [
        {"prompt_string": "x", "multimodal_data": [fake]}]})
    assert r.status_code == 400 and "multimodal_data" in r.json["error"]["message"]
    assert engine.sent == []
