"""Images in chat end to end: the official openai, anthropic and ollama SDKs against `blazar serve` with the real
llama-server, Gemma 3 270M and a tiny gemma3 projector written at test time (tests/support/tiny_mmproj.py). The
projector's weights are random, so these tests assert the plumbing, never the words: the image reaches the engine
(more prompt tokens than the same chat without it), its bytes reach no file of the home (log, WAL, audit export),
and every refusal (a JPEG of thousands of scans among them) is a 400 in the caller's own shape before any load."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import httpx2
import ollama
import openai
import pytest
from PIL import Image

from tests.support.hostile_media import many_scan_jpeg, progressive_jpeg
from tests.support.sdk_daemons import OpenAIDaemon
from tests.support.serving import blazar_cli, serving_gemma
from tests.support.tiny_mmproj import write_tiny_mmproj

SEER = "seer"  # Gemma 3 270M with the tiny projector
DEMO = "demo"  # the same GGUF without one
PROMPT = "Describe the picture."


def picture(fmt: str = "JPEG", size: tuple[int, int] = (64, 48)) -> bytes:
    """An image made here: a gradient, so no two pixels of a row are alike (nothing a codec folds to nothing)."""
    img = Image.new("RGB", size)
    img.putdata([(x * 4 % 256, y * 5 % 256, (x + y) % 256) for y in range(size[1]) for x in range(size[0])])
    out = io.BytesIO()
    img.save(out, format=fmt)
    return out.getvalue()


IMAGE = picture()
B64 = base64.b64encode(IMAGE).decode()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[OpenAIDaemon]:
    home = tmp_path_factory.mktemp("images-home")
    settings = {"ctx": 1024, "slots": 1, "queue_timeout_s": 120, "image_fetch_timeout_s": 5}
    with serving_gemma(home, engine_binary, gemma_path, DEMO, settings, template=None) as (port, proc):
        projector = write_tiny_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny.gguf", n_embd=640)
        blazar_cli(home, "import", str(gemma_path), "--name", SEER)
        blazar_cli(home, "model", "set", SEER, "--mmproj", str(projector))
        yield OpenAIDaemon(home, port, proc)


def oa(d: OpenAIDaemon) -> openai.OpenAI:
    return d.client()


def an(d: OpenAIDaemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=d.base, api_key="unused", max_retries=0, timeout=120)


def ol(d: OpenAIDaemon) -> ollama.Client:
    return ollama.Client(host=d.base, timeout=120, trust_env=False)


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def openai_chat(d: OpenAIDaemon, model: str, *parts: dict) -> openai.types.chat.ChatCompletion:
    content = [*parts, {"type": "text", "text": PROMPT}]
    return oa(d).chat.completions.create(model=model, max_tokens=2, temperature=0,
                                         messages=[{"role": "user", "content": content}])  # type: ignore[list-item]


def media_of(d: OpenAIDaemon, trace: str) -> dict | None:
    """The request's media facts, recorded once the key's checks passed and its parts were read."""
    d.wait_trace(trace, "request.completed")
    return next((e["data"]["media"] for e in d.events("request.media_checked") if e["trace_id"] == trace), None)


def test_an_image_costs_prompt_tokens_through_each_sdk(daemon: OpenAIDaemon) -> None:
    without = openai_chat(daemon, SEER).usage
    assert without is not None
    # OpenAI: an image_url part with a data URL.
    raw = oa(daemon).chat.completions.with_raw_response.create(
        model=SEER, max_tokens=2, temperature=0,
        messages=[{"role": "user", "content": [image_part(f"data:image/jpeg;base64,{B64}"),  # type: ignore[list-item]
                                               {"type": "text", "text": PROMPT}]}])
    chat = raw.parse()
    assert chat.usage is not None and chat.usage.prompt_tokens > without.prompt_tokens
    media = media_of(daemon, raw.headers["x-blazar-trace-id"])
    assert media == {"images": 1, "image_types": ["image/jpeg"], "image_bytes": len(IMAGE), "image_pixels": 64 * 48,
                     "images_fetched": 0, "image_tokens": 16, "audio_clips": 0, "audio_formats": [],
                     "audio_bytes": 0}
    # Anthropic: an image block, base64 (declared PNG: the bytes say JPEG, and that is what the engine is told).
    text_only = an(daemon).messages.create(model=SEER, max_tokens=2, messages=[{"role": "user", "content": PROMPT}])
    msg = an(daemon).messages.create(model=SEER, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}},
        {"type": "text", "text": PROMPT}]}])
    assert msg.usage.input_tokens > text_only.usage.input_tokens
    # Ollama: images on a chat message, and on /api/generate.
    plain = ol(daemon).chat(model=SEER, messages=[{"role": "user", "content": PROMPT}], options={"num_predict": 2})
    seen = ol(daemon).chat(model=SEER, messages=[{"role": "user", "content": PROMPT, "images": [IMAGE]}],
                           options={"num_predict": 2})
    assert seen.prompt_eval_count > plain.prompt_eval_count
    gen_plain = ol(daemon).generate(model=SEER, prompt=PROMPT, options={"num_predict": 2})
    gen_seen = ol(daemon).generate(model=SEER, prompt=PROMPT, images=[IMAGE], options={"num_predict": 2})
    assert gen_seen.prompt_eval_count > gen_plain.prompt_eval_count


def test_why_tells_the_images_facts(daemon: OpenAIDaemon) -> None:
    raw = oa(daemon).chat.completions.with_raw_response.create(
        model=SEER, max_tokens=1, messages=[{"role": "user", "content": [  # type: ignore[list-item]
            image_part(f"data:image/jpeg;base64,{B64}"), {"type": "text", "text": PROMPT}]}])
    trace = raw.headers["x-blazar-trace-id"]
    daemon.wait_trace(trace, "request.completed")
    told = blazar_cli(daemon.home, "why", trace).stdout
    assert f"1 image (image/jpeg; {len(IMAGE)} B, 0.00 Mpx, 16 prompt tokens)" in told


def test_an_image_to_a_model_without_a_projector_is_400_in_each_shape(daemon: OpenAIDaemon) -> None:
    fix = f"model '{DEMO}' has no vision projector; import one with blazar model set {DEMO} --mmproj FILE"
    with pytest.raises(openai.BadRequestError) as e:
        openai_chat(daemon, DEMO, image_part(f"data:image/jpeg;base64,{B64}"))
    assert e.value.status_code == 400 and e.value.body["message"] == fix
    # A decision, recorded: `blazar why` tells it.
    trace = e.value.response.headers["x-blazar-trace-id"]
    assert daemon.wait_trace(trace, "request.rejected") == ["request.received", "request.rejected"]
    rejected = next(ev for ev in daemon.events("request.rejected") if ev["trace_id"] == trace)["data"]
    assert rejected["reason"] == "invalid_request" and rejected["detail"] == fix
    with pytest.raises(anthropic.BadRequestError) as a:
        an(daemon).messages.create(model=DEMO, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": B64}}]}])
    assert a.value.body["type"] == "error" and a.value.body["error"]["type"] == "invalid_request_error"
    assert a.value.body["error"]["message"] == fix
    for call in (lambda: ol(daemon).chat(model=DEMO, messages=[{"role": "user", "content": "x", "images": [IMAGE]}]),
                 lambda: ol(daemon).generate(model=DEMO, prompt="x", images=[IMAGE])):
        with pytest.raises(ollama.ResponseError) as o:
            call()
        assert o.value.status_code == 400 and o.value.error == fix
    # Audio the same way: OpenAI's input_audio part needs a projector with audio (the tiny one has vision only).
    wav = base64.b64encode(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(28)).decode()
    clip = {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
    with pytest.raises(openai.BadRequestError) as e:
        openai_chat(daemon, DEMO, clip)
    assert e.value.body["message"].startswith(f"model '{DEMO}' has no audio projector")
    with pytest.raises(openai.BadRequestError) as e:
        openai_chat(daemon, SEER, clip)
    assert e.value.body["message"].startswith(f"model '{SEER}' has a projector for vision, not audio")
    # Refused before any load: the demo model was never started.
    assert not [e for e in daemon.events("instance.started") if e["data"]["model"] == DEMO]


def test_bytes_that_are_not_an_image_and_requests_over_the_bounds_are_400s(daemon: OpenAIDaemon) -> None:
    fake = base64.b64encode(b"%PDF-1.7 this is not a picture").decode()
    with pytest.raises(openai.BadRequestError) as e:
        openai_chat(daemon, SEER, image_part(f"data:image/png;base64,{fake}"))
    assert "PNG, JPEG, WebP, GIF or BMP" in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as a:
        an(daemon).messages.create(model=SEER, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": fake}}]}])
    assert "PNG, JPEG, WebP, GIF or BMP" in a.value.body["error"]["message"]
    many = [image_part(f"data:image/jpeg;base64,{B64}")] * 9  # the default bound is 8
    with pytest.raises(openai.BadRequestError) as e:
        openai_chat(daemon, SEER, *many)
    assert "over the 8 allowed (inputs.image_max_count)" in e.value.body["message"]
    out = io.BytesIO()
    Image.new("RGB", (7000, 5000), (9, 9, 9)).save(out, format="PNG")  # 35 Mpx (over the default 33), a small file
    huge = base64.b64encode(out.getvalue()).decode()
    with pytest.raises(ollama.ResponseError) as o:
        ol(daemon).chat(model=SEER, messages=[{"role": "user", "content": "x", "images": [huge]}])
    assert o.value.status_code == 400 and "image_max_megapixels" in o.value.error
    blazar_cli(daemon.home, "config", "set", "inputs.image_max_mib", "1")
    try:
        two_mib = base64.b64encode(picture("BMP", (1000, 700))).decode()  # 2.1 MB
        with pytest.raises(openai.BadRequestError) as e:
            openai_chat(daemon, SEER, image_part(f"data:image/bmp;base64,{two_mib}"))
        assert "over 1 MiB (inputs.image_max_mib)" in e.value.body["message"]
    finally:
        blazar_cli(daemon.home, "config", "set", "inputs.image_max_mib", "20")
    # A body over max_body_mib (32) is the gateway's 413, as for any request.
    big = "A" * (33 << 20)
    r = httpx2.post(f"{daemon.base}/v1/chat/completions", trust_env=False, timeout=60, json={
        "model": SEER, "messages": [{"role": "user", "content": [image_part(f"data:image/png;base64,{big}")]}]})
    assert r.status_code == 413


def test_a_jpeg_of_thousands_of_scans_is_refused_in_each_shape(daemon: OpenAIDaemon) -> None:
    # A progressive JPEG with one scan repeated 5,000 times (265 KB): every scan is decoded over the whole image, so
    # such a file costs seconds at a few megapixels. Its scans are counted from its bytes, before any decode.
    scans = base64.b64encode(many_scan_jpeg(5000)).decode()
    told = "the JPEG has 5000 scans, over the 100 an image may have"
    with pytest.raises(openai.BadRequestError) as e:
        openai_chat(daemon, SEER, image_part(f"data:image/jpeg;base64,{scans}"))
    assert e.value.status_code == 400 and e.value.code == "image_too_complex" and told in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as a:
        an(daemon).messages.create(model=SEER, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": scans}}]}])
    assert a.value.body["error"]["type"] == "invalid_request_error" and told in a.value.body["error"]["message"]
    with pytest.raises(ollama.ResponseError) as o:
        ol(daemon).chat(model=SEER, messages=[{"role": "user", "content": "x", "images": [scans]}])
    assert o.value.status_code == 400 and told in o.value.error
    # The same picture as its encoder wrote it (10 scans) is served.
    fine = base64.b64encode(progressive_jpeg()).decode()
    assert openai_chat(daemon, SEER, image_part(f"data:image/jpeg;base64,{fine}")).usage is not None


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(IMAGE)))
        self.end_headers()
        self.wfile.write(IMAGE)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def image_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/cat.jpg"
    server.shutdown()
    server.server_close()


def test_image_urls_are_fetched_only_when_allowed_and_never_from_private_addresses(
        daemon: OpenAIDaemon, image_server: str) -> None:
    # Off (the default): an http URL is a 400 that says how to send the image instead.
    with pytest.raises(openai.BadRequestError) as e:
        openai_chat(daemon, SEER, image_part(image_server))
    assert "image_fetch is off" in e.value.body["message"]
    blazar_cli(daemon.home, "config", "set", "inputs.image_fetch", "true")
    try:
        # On, but the server is on loopback and no admin allowed it: refused after resolution.
        with pytest.raises(openai.BadRequestError) as e:
            openai_chat(daemon, SEER, image_part(image_server))
        assert "not a public address" in e.value.body["message"]
        with pytest.raises(anthropic.BadRequestError) as a:
            an(daemon).messages.create(model=SEER, max_tokens=2, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/latest/meta-data"}}]}])
        assert "not a public address" in a.value.body["error"]["message"]
        # The admin names the host: fetched, checked, and sent to the engine as a data URL.
        blazar_cli(daemon.home, "config", "set", "inputs.image_fetch_allow_hosts", "127.0.0.1")
        without = openai_chat(daemon, SEER).usage
        raw = oa(daemon).chat.completions.with_raw_response.create(
            model=SEER, max_tokens=2, temperature=0, messages=[{"role": "user", "content": [  # type: ignore[list-item]
                image_part(image_server), {"type": "text", "text": PROMPT}]}])
        chat = raw.parse()
        assert without is not None and chat.usage is not None and chat.usage.prompt_tokens > without.prompt_tokens
        media = media_of(daemon, raw.headers["x-blazar-trace-id"])
        assert media is not None and media["images_fetched"] == 1 and media["image_types"] == ["image/jpeg"]
    finally:
        blazar_cli(daemon.home, "config", "set", "inputs.image_fetch", "false")
        blazar_cli(daemon.home, "config", "set", "inputs.image_fetch_allow_hosts", "")


def test_zz_no_image_bytes_in_any_file_of_the_home_nor_the_audit(daemon: OpenAIDaemon, tmp_path: Path) -> None:
    """Last in the module: the image's base64 and a run of its raw bytes, in no file (db, WAL, audit export)."""
    audit = tmp_path / "audit.jsonl"
    blazar_cli(daemon.home, "audit", "export", "--out", str(audit))
    needles = [B64[100:200].encode(), IMAGE[200:260]]
    files = [p for p in daemon.home.rglob("*") if p.is_file() and p.suffix != ".gguf"] + [audit]
    assert any(p.name.endswith("-wal") or p.name.endswith(".db") for p in files)
    for path in files:
        data = path.read_bytes()
        for needle in needles:
            assert needle not in data, f"image bytes are in {path}"
