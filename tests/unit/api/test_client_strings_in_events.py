"""What a client sends that an event records is held to the event's bound at the edge: every string a request can
carry into the log (a model name, a session, a trace id, a language, a voice, a file's name, a batch's metadata, a
cascade), sent at its longest or made of control characters, is answered in the caller's terms, never with a 500
from an event refused by its bound (blazar/events/bounds.py). The real app, auth, gateway, admission and log; the
supervisor and the engine are fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from blazar.api.app import create_app
from blazar.context import Blazar
from blazar.events.types import encode
from blazar.serving.admission import Admission
from blazar.serving.gateway import Gateway
from tests.support.asgi import LocalConductor
from tests.support.audio_files import tone_wav
from tests.support.fakes import FakeEngine, KindsSupervisor
from tests.support.forms import multipart

LONG = 5000
CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


class SpeakingEngine(FakeEngine):
    """A chat engine whose piper child speaks: WAV for what is sent to a piper model."""

    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None = None) -> httpx2.Response:
        if path == "/synthesize":
            return httpx2.Response(200, content=tone_wav(0.2, 22050), headers={"content-type": "audio/wav"})
        return await super().open(base_url, path, body, api_key=api_key)


@pytest.fixture
async def client(app: Blazar) -> AsyncIterator[LocalConductor]:
    sup = KindsSupervisor()
    gateway = Gateway(app, sup, Admission(), SpeakingEngine())  # type: ignore[arg-type]
    async with LocalConductor(create_app(app, sup, gateway)) as c:  # type: ignore[arg-type]
        yield c


def _form(fields: dict[str, str], filename: str = "a.wav", data: bytes = tone_wav(0.5, 16000)) -> tuple[bytes, str]:
    return multipart(fields, filename, data)


async def _all_events_fit(app: Blazar) -> None:
    await app.request_writer().flush()
    async for r in app.log.read():
        encode(r.event)  # within every field's bound


CASES: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
    ("a long model name", "/v1/chat/completions", {**CHAT, "model": "m" * LONG}, {}),
    ("a model name of control characters", "/v1/chat/completions", {**CHAT, "model": "\x01" * 250}, {}),
    ("an Ollama model name", "/api/chat", {"model": "m" * LONG, "messages": CHAT["messages"], "stream": False}, {}),
    ("a long session", "/v1/chat/completions", CHAT, {"x-blazar-session": "s" * LONG}),
    ("a session of control characters", "/v1/chat/completions", CHAT, {"x-blazar-session": "\x7f" * 100}),
    ("a long trace id", "/v1/chat/completions", CHAT, {"x-blazar-trace-id": "t" * LONG}),
    ("a long traceparent", "/v1/chat/completions", CHAT, {"traceparent": "00-" + "a" * LONG}),
    ("a long cascade", "/v1/chat/completions", CHAT, {"x-blazar-cascade": ",".join(["c" * 256] * 4)}),
    ("a cascade too long", "/v1/chat/completions", CHAT, {"x-blazar-cascade": ",".join(["c"] * 50)}),
    ("a long previous response", "/v1/responses", {"model": "m", "input": "hi", "previous_response_id": "r" * LONG},
     {}),
    ("a speech voice of control characters", "/v1/audio/speech",
     {"model": "v-piper", "input": "hi", "voice": "\x00" * 256}, {}),
]


@pytest.mark.parametrize(("route", "body", "headers"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_a_string_a_request_carries_into_the_log_never_makes_a_500(
        app: Blazar, client: LocalConductor, route: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    r = await client.simulate_post(route, json=body, headers=headers)
    assert r.status_code < 500, r.text  # an event refused by its bound would be an internal error
    await _all_events_fit(app)
    if route == "/v1/audio/speech":
        (audio,) = [e.event async for e in app.log.read(types=["request.audio"])]
        assert audio.voice == body["voice"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("language", ["l" * 3000, "en\x00" * 100, "english please"])
async def test_a_transcription_language_that_is_no_language_code_is_a_400(
        app: Blazar, client: LocalConductor, language: str) -> None:
    body, content_type = _form({"model": "w-whisper", "language": language})
    r = await client.simulate_post("/v1/audio/transcriptions", body=body, headers={"Content-Type": content_type})
    assert r.status_code == 400 and "language code" in r.json["error"]["message"], r.text
    await _all_events_fit(app)


async def test_an_uploads_long_name_is_kept_as_a_bounded_label(app: Blazar, client: LocalConductor) -> None:
    body, content_type = _form({"purpose": "batch"}, filename="f" * LONG + ".jsonl", data=b'{"a": 1}\n')
    r = await client.simulate_post("/v1/files", body=body, headers={"Content-Type": content_type})
    assert r.status_code == 200, r.text
    assert len(r.json["filename"]) <= 255
    await _all_events_fit(app)


async def test_a_batch_with_the_most_metadata_is_recorded(app: Blazar, client: LocalConductor) -> None:
    line = b'{"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", ' \
           b'"messages": [{"role": "user", "content": "hi"}]}}\n'
    body, content_type = _form({"purpose": "batch"}, filename="in.jsonl", data=line)
    uploaded = await client.simulate_post("/v1/files", body=body, headers={"Content-Type": content_type})
    assert uploaded.status_code == 200, uploaded.text
    metadata = {f"{i:02d}" + "\x00" * 62: "\x00" * 512 for i in range(16)}  # 16 pairs, each at OpenAI's most
    r = await client.simulate_post("/v1/batches", json={"input_file_id": uploaded.json["id"], "metadata": metadata,
                                                         "endpoint": "/v1/chat/completions",
                                                         "completion_window": "24h"})
    assert r.status_code == 200, r.text
    await _all_events_fit(app)
    created = [e.event async for e in app.log.read(types=["batch.created"])]
    assert len(created) == 1 and created[0].metadata == metadata  # type: ignore[attr-defined]
