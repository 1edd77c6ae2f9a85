"""One order for every request (docs/2.ARCHITECTURE.md, "One order for every request"): the key, the route's access,
the model resolved, the key's scope, the model's kind and capabilities, the key's limits, and only then any work on
the body's content. Every inference route of the assembled app is called by a key whose scope does not cover the
model, with a body that would be expensive to process (images, audio, a voice to check); the work is counted (image
and audio decodes, fetches, audio probes, voice checks, loads, engine requests): none happens before the 403. The
real app, auth, gateway and admission; the supervisor and the engine client are fakes that count what reaches them.
"""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import falcon.asgi
import pytest
from PIL import Image

from blazar.api import audio as audio_routes
from blazar.api.app import create_app
from blazar.api.proxy import Proxy
from blazar.context import Blazar
from blazar.operations import keys
from blazar.serving import media
from blazar.serving.admission import Admission
from blazar.serving.gateway import Gateway
from tests.support.asgi import LocalConductor
from tests.support.audio_files import tone_wav
from tests.support.fakes import FakeEngine, KindsSupervisor
from tests.support.forms import multipart

HIDDEN = "hidden-model"  # in the store, outside the scoped key's scope
MISSING = "missing"  # in no store (FakeSupervisor's unknown name), and outside the scope too
ALLOWED = "allowed-model"
WHISPER, PIPER = "allowed-whisper", "allowed-piper"


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


PNG64 = base64.b64encode(_png()).decode()
WAV = tone_wav(1.0, 16000)
WAV64 = base64.b64encode(WAV).decode()
IMAGE_PART = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG64}"}}
AUDIO_PART = {"type": "input_audio", "input_audio": {"data": WAV64, "format": "wav"}}


def _json_body(route: str, model: str) -> dict[str, Any]:
    """A body that would cost work on `route`: every image or audio part the dialect takes, else plenty of text."""
    text = "a long input " * 200
    return {
        "/v1/chat/completions": {"model": model, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE_PART, IMAGE_PART, AUDIO_PART]}]},
        "/v1/messages": {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG64}},
            {"type": "text", "text": "look"}]}]},
        "/v1/responses": {"model": model, "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG64}"}]}]},
        "/api/chat": {"model": model, "messages": [{"role": "user", "content": "look", "images": [PNG64, PNG64]}]},
        "/api/generate": {"model": model, "prompt": "look", "images": [PNG64]},
        "/v1/completions": {"model": model, "prompt": text},
        "/v1/embeddings": {"model": model, "input": [text] * 8},
        "/api/embed": {"model": model, "input": [text] * 8},
        "/api/embeddings": {"model": model, "prompt": text},
        "/v1/rerank": {"model": model, "query": "which", "documents": [text] * 8},
        "/rerank": {"model": model, "query": "which", "documents": [text] * 8},
        "/v1/audio/speech": {"model": model, "input": "Hello there. " * 50, "voice": "no-such-speaker"},
    }[route]


def _form(model: str) -> tuple[bytes, str]:
    return multipart({"model": model}, "a.wav", WAV, "audio/wav")


UPLOADS = ("/v1/audio/transcriptions", "/v1/audio/translations")
ROUTES = (*UPLOADS, "/v1/chat/completions", "/v1/messages", "/v1/responses", "/api/chat", "/api/generate",
          "/v1/completions", "/v1/embeddings", "/api/embed", "/api/embeddings", "/v1/rerank", "/rerank",
          "/v1/audio/speech")


@dataclass
class Work:
    """What was done on a request's content, counted."""

    counts: dict[str, int]
    sup: KindsSupervisor
    engine: FakeEngine

    def total(self) -> dict[str, int]:
        return {**self.counts, "loads": len(self.sup.ensured), "engine": len(self.engine.sent)}


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Iterator[Work]:
    counts = {"images": 0, "audio_parts": 0, "fetches": 0, "probes": 0, "voices": 0}

    def counting(name: str, real: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)
        return counted

    monkeypatch.setattr(media, "inspect_image", counting("images", media.inspect_image))
    monkeypatch.setattr(media, "inspect_audio", counting("audio_parts", media.inspect_audio))
    monkeypatch.setattr(media, "fetch_image", counting("fetches", media.fetch_image))
    monkeypatch.setattr(audio_routes.codec, "probe", counting("probes", audio_routes.codec.probe))
    monkeypatch.setattr(audio_routes.Speech, "_check_voice",
                        counting("voices", audio_routes.Speech._check_voice))
    yield Work(counts, KindsSupervisor(), FakeEngine())


@dataclass
class Keys:
    scoped: str
    limited: str


@pytest.fixture
async def client(app: Blazar, work: Work) -> AsyncIterator[tuple[LocalConductor, falcon.asgi.App]]:
    gateway = Gateway(app, work.sup, Admission(), work.engine)  # type: ignore[arg-type]
    api = create_app(app, work.sup, gateway)  # type: ignore[arg-type]
    async with LocalConductor(api) as c:
        yield c, api


@pytest.fixture
async def keyed(app: Blazar) -> Keys:
    _, scoped = await keys.create(app, "scoped", models=["allowed*"])
    _, limited = await keys.create(app, "limited", models=["allowed*"], rpm=1)
    return Keys(scoped, limited)


async def _call(c: LocalConductor, route: str, model: str, secret: str) -> Any:
    headers = {"Authorization": f"Bearer {secret}"}
    if route in UPLOADS:
        body, content_type = _form(model)
        return await c.simulate_post(route, body=body, headers={**headers, "Content-Type": content_type})
    return await c.simulate_post(route, json=_json_body(route, model), headers=headers)


def _proxy_routes(api: falcon.asgi.App) -> set[str]:
    def walk(items: list[Any]) -> Iterator[Any]:
        for node in items:
            if node.resource is not None:
                yield node
            yield from walk(node.children)

    return {n.uri_template for n in walk(api._router._roots) if isinstance(n.resource, Proxy)}


async def test_the_walk_covers_every_inference_route(client: tuple[LocalConductor, falcon.asgi.App]) -> None:
    """A new inference route must be walked here (with a body that would cost work on it)."""
    assert _proxy_routes(client[1]) == set(ROUTES)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("model", [HIDDEN, MISSING])
async def test_an_out_of_scope_model_is_403_before_any_work(client: tuple[LocalConductor, falcon.asgi.App],
                                                            keyed: Keys, work: Work, route: str, model: str) -> None:
    r = await _call(client[0], route, model, keyed.scoped)
    assert r.status_code == 403, r.text
    assert "allowed*" in r.text and model in r.text  # names the scope, and the model as the client named it
    assert set(work.total().values()) == {0}, work.total()


@pytest.mark.parametrize(("route", "model"), [("/v1/chat/completions", "hidden-whisper"),
                                              ("/api/chat", "hidden-piper"),
                                              ("/v1/rerank", "hidden-whisper"),
                                              ("/v1/audio/speech", HIDDEN),
                                              ("/v1/audio/transcriptions", "hidden-piper")])
async def test_a_model_outside_the_scope_says_nothing_of_its_kind(client: tuple[LocalConductor, falcon.asgi.App],
                                                                  keyed: Keys, work: Work, route: str,
                                                                  model: str) -> None:
    r = await _call(client[0], route, model, keyed.scoped)
    assert r.status_code == 403, r.text
    said = r.text.replace(model, "")  # the name is the client's own; nothing else may tell the kind
    assert "whisper" not in said and "piper" not in said and "kind" not in said
    assert set(work.total().values()) == {0}


@pytest.mark.parametrize(("route", "model", "kind"), [("/v1/chat/completions", WHISPER, "whisper"),
                                                      ("/v1/audio/speech", ALLOWED, "llama-server"),
                                                      ("/v1/audio/transcriptions", PIPER, "piper")])
async def test_in_its_scope_the_kind_is_checked_before_any_work(client: tuple[LocalConductor, falcon.asgi.App],
                                                                keyed: Keys, work: Work, route: str, model: str,
                                                                kind: str) -> None:
    r = await _call(client[0], route, model, keyed.scoped)
    assert r.status_code == 400 and "model_kind_mismatch" in r.text and kind in r.text, r.text
    assert set(work.total().values()) == {0}


async def test_a_key_past_its_rpm_is_429_before_any_work(client: tuple[LocalConductor, falcon.asgi.App],
                                                         keyed: Keys, work: Work) -> None:
    c = client[0]
    first = await _call(c, "/v1/chat/completions", ALLOWED, keyed.limited)
    assert first.status_code == 200, first.text
    done = work.total()
    assert done["images"] == 2 and done["audio_parts"] == 1 and done["engine"] == 1  # in order: the work was done
    for route in ("/v1/chat/completions", "/api/chat", "/v1/audio/transcriptions", "/v1/audio/speech"):
        model = WHISPER if route in UPLOADS else PIPER if route == "/v1/audio/speech" else ALLOWED
        r = await _call(c, route, model, keyed.limited)
        assert r.status_code == 429 and r.headers["retry-after"], r.text
    assert work.total() == done


async def test_content_refused_after_the_checks_is_recorded_as_the_requests_refusal(
        app: Blazar, client: tuple[LocalConductor, falcon.asgi.App], keyed: Keys, work: Work) -> None:
    """A bad image found once the checks passed ends the request like any refusal: request.rejected, in order."""
    bad = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"%PDF").decode()}}
    r = await client[0].simulate_post("/v1/chat/completions", json={
        "model": ALLOWED, "messages": [{"role": "user", "content": [bad]}]},
        headers={"Authorization": f"Bearer {keyed.scoped}"})
    assert r.status_code == 400 and r.json["error"]["code"] == "invalid_image"
    trace = r.headers["x-blazar-trace-id"]
    await app.request_writer().flush()
    types = [rec.type async for rec in app.log.read(trace_id=trace)]
    assert types == ["request.received", "request.rejected"]
    assert work.total()["engine"] == 0 and work.total()["loads"] == 0
