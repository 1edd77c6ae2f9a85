"""Images and audio in chat requests (blazar/serving/media.py, blazar/adapters/images.py, image_fetch.py): checked by
their bytes, bounded per request, fetched only when allowed and never into the private network."""

from __future__ import annotations

import base64
import io
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from PIL import Image, ImageFile

from blazar import config
from blazar.adapters.image_fetch import fetch_image, is_public
from blazar.adapters.images import MAX_JPEG_SCANS, inspect_audio, inspect_image, jpeg_scans
from blazar.errors import DialectError, Refused
from blazar.projections.catalog import CatalogState
from blazar.serving import media
from blazar.serving.media import check_projector, media_parts, prepare
from blazar.serving.request import Request
from tests.support.hostile_media import many_scan_jpeg, progressive_jpeg


def picture(fmt: str = "PNG", size: tuple[int, int] = (32, 24)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 40, 90)).save(out, format=fmt)
    return out.getvalue()


def data_url(raw: bytes, declared: str = "image/png") -> str:
    return f"data:{declared};base64,{base64.b64encode(raw).decode()}"


def chat(*urls: str, audio: str | None = None) -> Request:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    if audio is not None:
        parts.append({"type": "input_audio", "input_audio": {"data": audio, "format": "mp3"}})
    parts.append({"type": "text", "text": "what is this?"})
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    return Request(model="m", engine_path="/v1/chat/completions", body=None, stream=False, parsed=body)


async def prepared(request: Request, **settings: Any) -> Request:
    inputs = config.build({f"inputs.{k}": v for k, v in settings.items()})
    return await prepare(request, inputs, CatalogState())


@pytest.mark.parametrize("fmt,mime", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"),
                                      ("GIF", "image/gif"), ("BMP", "image/bmp")])
def test_each_accepted_type_is_read_from_its_bytes(fmt: str, mime: str) -> None:
    info = inspect_image(picture(fmt), where="x", max_pixels=10**6)
    assert (info.media_type, info.width, info.height, info.pixels) == (mime, 32, 24, 768)


def test_bytes_that_are_not_an_image_are_refused_naming_the_accepted_types() -> None:
    with pytest.raises(DialectError, match="PNG, JPEG, WebP, GIF or BMP") as e:
        inspect_image(b"%PDF-1.7 not a picture at all", where="messages[0].content[0]", max_pixels=10**6)
    assert e.value.http_status == 400 and "messages[0].content[0]" in e.value.message


def test_an_image_type_outside_the_five_is_refused() -> None:
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, format="TIFF")
    with pytest.raises(DialectError, match="not an image Blazar accepts"):
        inspect_image(out.getvalue(), where="x", max_pixels=10**6)


def test_a_truncated_image_is_refused_not_passed_to_the_engine() -> None:
    raw = picture("PNG", (64, 64))
    with pytest.raises(DialectError):
        inspect_image(raw[: len(raw) // 2], where="x", max_pixels=10**6)


def test_a_decompression_bomb_is_refused_from_its_header_without_decoding() -> None:
    # A PNG whose header claims 30000 x 30000 pixels (900 Mpx): refused by the header alone.
    raw = picture("PNG", (1, 1))
    ihdr = struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)
    import zlib
    bomb = raw[:8] + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)) + raw[33:]
    with pytest.raises(DialectError) as e:
        inspect_image(bomb, where="x", max_pixels=33_000_000)
    assert e.value.code in ("image_too_large", "invalid_image")


def test_a_progressive_jpeg_as_encoders_write_it_is_accepted() -> None:
    raw = progressive_jpeg()
    assert jpeg_scans(raw) == 10  # libjpeg's progressive script for a colour image
    assert inspect_image(raw, where="x", max_pixels=10**6).media_type == "image/jpeg"
    assert inspect_image(many_scan_jpeg(MAX_JPEG_SCANS), where="x", max_pixels=10**6).media_type == "image/jpeg"


def test_a_jpeg_of_too_many_scans_is_refused_from_its_bytes_without_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = many_scan_jpeg(MAX_JPEG_SCANS + 1)
    with Image.open(io.BytesIO(raw)) as img:  # a JPEG Pillow decodes, every one of its scans
        img.load()
    decoded: list[object] = []
    real = ImageFile.ImageFile.load

    def load(self: ImageFile.ImageFile) -> object:
        decoded.append(self)
        return real(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    with pytest.raises(DialectError) as e:
        inspect_image(raw, where="messages[0].content[0]", max_pixels=10**6)
    assert (e.value.http_status, e.value.code) == (400, "image_too_complex")
    assert e.value.message.startswith(f"messages[0].content[0]: the JPEG has {MAX_JPEG_SCANS + 1} scans, over the "
                                      f"{MAX_JPEG_SCANS} an image may have")
    assert decoded == []  # counted from the bytes: not one scan was decoded


def test_an_mpo_is_read_as_the_jpeg_it_is() -> None:
    out = io.BytesIO()
    Image.new("RGB", (16, 16)).save(out, "MPO", save_all=True, append_images=[Image.new("RGB", (16, 16), (9, 9, 9))])
    assert inspect_image(out.getvalue(), where="x", max_pixels=10**6).media_type == "image/jpeg"


def test_audio_formats_are_read_from_the_bytes() -> None:
    assert inspect_audio(b"RIFF\x00\x00\x00\x00WAVEfmt ", where="a") == "wav"
    assert inspect_audio(b"ID3\x04\x00", where="a") == "mp3"
    with pytest.raises(DialectError, match="WAV or MP3"):
        inspect_audio(b"OggS\x00\x02", where="a")


def test_parts_are_found_in_every_message() -> None:
    body = {"messages": [{"role": "system", "content": "s"},
                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "image_url", "image_url": {"url": "x"}}]},
                         {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}
    assert [(i, j) for i, j, _ in media_parts(body)] == [(1, 1), (2, 0)]


def test_a_model_without_a_projector_is_refused_with_the_fix() -> None:
    with pytest.raises(Refused, match=r"model 'demo' has no vision projector; import one with blazar model set "
                                      r"demo --mmproj FILE") as e:
        check_projector("demo", "demo", None, frozenset({"vision"}))
    assert e.value.http_status == 400
    with pytest.raises(Refused, match="has a projector for vision, not audio"):
        check_projector("g", "g", ("vision",), frozenset({"vision", "audio"}))
    check_projector("g", "g", ("vision", "audio"), frozenset({"vision", "audio"}))


async def test_a_checked_request_carries_the_facts_and_keeps_the_clients_bytes() -> None:
    png, jpeg = picture("PNG"), picture("JPEG", (10, 10))
    got = await prepared(chat(data_url(png), data_url(jpeg, "image/jpeg")))
    assert got.body is None  # nothing to rewrite: the engine gets the client's own bytes
    assert got.media is not None
    assert (got.media.images, got.media.image_types) == (2, ["image/png", "image/jpeg"])
    assert got.media.image_bytes == len(png) + len(jpeg) and got.media.image_pixels == 32 * 24 + 100


async def test_a_wrongly_declared_type_is_rewritten_to_the_true_one() -> None:
    jpeg = picture("JPEG")
    got = await prepared(chat(data_url(jpeg, "image/png")))
    assert got.body is not None
    assert got.body["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert got.parsed["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png")  # not changed


async def test_bounds_on_count_bytes_and_pixels() -> None:
    png = data_url(picture("PNG", (100, 100)))
    with pytest.raises(DialectError, match="over the 2 allowed"):
        await prepared(chat(png, png, png), image_max_count=2)
    big = data_url(picture("BMP", (800, 800)), "image/bmp")  # about 1.9 MB
    with pytest.raises(DialectError, match="over 1 MiB"):
        await prepared(chat(big), image_max_mib=1)
    with pytest.raises(DialectError, match=r"come to 1\.3 Mpx, over the 1 Mpx"):
        await prepared(chat(data_url(picture("PNG", (800, 800))), data_url(picture("PNG", (800, 800)))),
                       image_max_megapixels=1)


async def test_an_http_url_is_refused_while_image_fetch_is_off() -> None:
    with pytest.raises(DialectError, match="image_fetch is off") as e:
        await prepared(chat("http://example.com/cat.png"))
    assert e.value.http_status == 400


async def test_not_base64_and_not_audio_are_400s() -> None:
    with pytest.raises(DialectError, match="not valid base64"):
        await prepared(chat("data:image/png;base64,@@@"))
    with pytest.raises(DialectError, match="WAV or MP3"):
        await prepared(chat(audio=base64.b64encode(b"not audio at all").decode()))


@pytest.mark.parametrize("address,public", [
    ("8.8.8.8", True), ("2606:4700:4700::1111", True), ("127.0.0.1", False), ("10.1.2.3", False),
    ("192.168.1.1", False), ("172.16.0.1", False), ("169.254.169.254", False), ("100.64.0.1", False),
    ("0.0.0.0", False), ("::1", False), ("fe80::1", False), ("fd00::1", False), ("::ffff:127.0.0.1", False),
    ("224.0.0.1", False)])
def test_only_global_addresses_are_public(address: str, public: bool) -> None:
    assert is_public(address) is public


@pytest.fixture
async def server() -> AsyncIterator[str]:
    png = picture("PNG")

    async def image(_: web.Request) -> web.Response:
        return web.Response(body=png, content_type="image/png")

    async def page(_: web.Request) -> web.Response:
        return web.Response(text="<html>", content_type="text/html")

    async def huge(_: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG" + b"0" * (3 << 20), content_type="image/png")

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "image/png"})
        resp.enable_chunked_encoding()  # no Content-Length: the bound is counted as it comes
        await resp.prepare(request)
        for _ in range(40):
            await resp.write(b"0" * (64 << 10))
        await resp.write_eof()
        return resp

    async def hop(_: web.Request) -> web.Response:
        raise web.HTTPFound("http://localhost:9/secret.png")

    app = web.Application()
    app.add_routes([web.get("/cat.png", image), web.get("/page", page), web.get("/huge", huge),
                    web.get("/chunked", chunked), web.get("/hop", hop)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_a_loopback_server_is_refused_unless_the_admin_allows_its_host(server: str) -> None:
    with pytest.raises(DialectError, match="not a public address"):
        await fetch_image(f"{server}/cat.png", max_bytes=1 << 20, timeout_s=5, allow_hosts=[])
    raw = await fetch_image(f"{server}/cat.png", max_bytes=1 << 20, timeout_s=5, allow_hosts=["127.0.0.1"])
    assert raw == picture("PNG")


async def test_localhost_by_name_is_refused_after_resolution(server: str) -> None:
    with pytest.raises(DialectError, match="not a public address"):
        await fetch_image(server.replace("127.0.0.1", "localhost") + "/cat.png", max_bytes=1 << 20, timeout_s=5,
                          allow_hosts=["127.0.0.1"])


async def test_a_redirect_is_checked_again(server: str) -> None:
    with pytest.raises(DialectError, match=r"secret\.png.: localhost resolves to .*, not a public address"):
        await fetch_image(f"{server}/hop", max_bytes=1 << 20, timeout_s=5, allow_hosts=["127.0.0.1"])


async def test_a_fetch_is_bounded_in_type_and_size(server: str) -> None:
    with pytest.raises(DialectError, match="text/html, not an image"):
        await fetch_image(f"{server}/page", max_bytes=1 << 20, timeout_s=5, allow_hosts=["127.0.0.1"])
    with pytest.raises(DialectError, match="3145732 bytes, over the 1048576"):
        await fetch_image(f"{server}/huge", max_bytes=1 << 20, timeout_s=5, allow_hosts=["127.0.0.1"])
    with pytest.raises(DialectError, match="over the 1048576 bytes"):
        await fetch_image(f"{server}/chunked", max_bytes=1 << 20, timeout_s=5, allow_hosts=["127.0.0.1"])


async def test_a_fetched_image_reaches_the_engine_as_a_data_url(server: str) -> None:
    got = await prepared(chat(f"{server}/cat.png"), image_fetch=True, image_fetch_allow_hosts=["127.0.0.1"])
    assert got.body is not None and got.media is not None and got.media.images_fetched == 1
    assert got.body["messages"][0]["content"][0]["image_url"]["url"] == data_url(picture("PNG"))



async def test_the_projector_is_checked_from_the_parts_types_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway checks the projector before anything is decoded or fetched (`carried`: the parts' types)."""
    monkeypatch.setattr(media, "projector_modalities", lambda catalog, model: ("demo", None))
    catalog = CatalogState()
    for url in (data_url(picture()), "http://203.0.113.9/cat.png", "not even a url"):
        needed = media.carried(chat(url))
        assert needed == frozenset({"vision"})
        with pytest.raises(Refused, match="has no vision projector"):
            media.refuse_unless_projector(catalog, "demo", needed)
    media.refuse_unless_projector(catalog, "demo", frozenset())  # no parts: nothing needed
