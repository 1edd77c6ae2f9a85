"""Images and audio in a chat request: every dialect has turned its own (Ollama's `images`, Anthropic's `image`
blocks, Responses' `input_image`) into OpenAI `image_url` / `input_audio` parts, so one pass here checks them all.
The gateway runs it in a request's order (docs/2.ARCHITECTURE.md): only once the key's scope, the model's kind and
the key's limits allow the request is any part decoded or fetched.

    the model can take them (`refuse_unless_projector`: its projector's modalities, from the parts' types alone;
       else 400 naming the fix), among the model's capabilities, before the key's limits are charged
    -> each part's bytes: a data: URL decoded, an http(s) URL fetched when `image_fetch` allows it
    -> checked by their bytes (blazar/adapters/images.py) and bounded per request (count, bytes, pixels)
    -> the Request with the facts (`MediaFacts`: counts, types, sizes; never the bytes) and, where a URL was fetched
       or a declared type was wrong, the engine's body rewritten to data: URLs of the true type.

The facts go into `request.media_checked`; the bytes go nowhere but the engine.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import replace
from typing import Any

from blazar.adapters.image_fetch import fetch_image
from blazar.adapters.images import inspect_audio, inspect_image
from blazar.config import Settings
from blazar.errors import DialectError, Refused
from blazar.events.requests import MediaFacts
from blazar.fit.projector import tokens_per_image
from blazar.projections.catalog import CatalogState, stored
from blazar.serving.request import Request

CHAT = "/v1/chat/completions"
MEDIA_PARTS = {"image_url": "vision", "input_audio": "audio"}


def media_parts(body: dict[str, Any]) -> list[tuple[int, int, dict[str, Any]]]:
    """(message index, part index, part) of every image_url and input_audio part in a chat body's messages."""
    found = []
    messages = body.get("messages")
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            found += [(i, j, p) for j, p in enumerate(content)
                      if isinstance(p, dict) and p.get("type") in MEDIA_PARTS]
    return found


def needed_modalities(parts: list[tuple[int, int, dict[str, Any]]]) -> frozenset[str]:
    return frozenset(MEDIA_PARTS[str(p["type"])] for _, _, p in parts)


def check_projector(model: str, store_name: str, modalities: tuple[str, ...] | None,
                    needed: frozenset[str]) -> None:
    """Refused (400) when the model's projector (None: it has none) lacks a modality the request's parts need."""
    have = frozenset(modalities or ())
    missing = sorted(needed - have)
    if not missing:
        return
    what = missing[0]
    if modalities is None:
        msg = (f"model '{model}' has no {what} projector; import one with blazar model set {store_name} "
               f"--mmproj FILE")
    else:
        msg = (f"model '{model}' has a projector for {', '.join(sorted(have)) or 'nothing'}, not {what}; "
               f"import one with blazar model set {store_name} --mmproj FILE")
    raise Refused(msg, reason="invalid_request", http_status=400,
                  observations={"needs": missing, "projector": sorted(have) if modalities is not None else None})


def projector_modalities(catalog: CatalogState, model: str) -> tuple[str, tuple[str, ...] | None] | None:
    """The store's name for `model` and its projector's modalities (None: no projector), or None when the model is
    not in this store (a remote engine's or another node's: it answers for itself)."""
    got = stored(catalog, model)
    if got is None:
        return None
    return got.name, (tuple(got.projector.modalities) if got.projector is not None else None)


async def prepare(request: Request, settings: Settings, catalog: CatalogState) -> Request:
    """The Request with its media checked (a 400 in the caller's dialect otherwise) and their facts; unchanged when
    it carries none."""
    if request.engine_path != CHAT:
        return request
    body = request.body if request.body is not None else request.parsed
    parts = media_parts(body)
    if not parts:
        return request
    if len(parts) > settings.inputs.image_max_count:
        raise DialectError(f"{len(parts)} images or audio parts in one request, over the "
                           f"{settings.inputs.image_max_count} allowed (inputs.image_max_count)",
                           code="too_many_images")
    checker = _Checker(settings)
    rewritten: dict[tuple[int, int], dict[str, Any]] = {}
    for i, j, part in parts:
        where = f"messages[{i}].content[{j}]"
        new = await (checker.image(part, where) if part["type"] == "image_url" else checker.audio(part, where))
        if new is not None:
            rewritten[(i, j)] = new
    facts = _with_image_tokens(checker.facts(), catalog, request.model)
    if not rewritten:
        return replace(request, media=facts)
    return replace(request, body=_rewrite(body, rewritten), media=facts)


def _with_image_tokens(facts: MediaFacts, catalog: CatalogState, model: str) -> MediaFacts:
    """The facts with the prompt tokens the images become, where the model's projector makes every image one size."""
    got = stored(catalog, model)
    per = tokens_per_image(got.projector.metadata) if got is not None and got.projector is not None else None
    return facts if per is None or not facts.images else facts.model_copy(update={"image_tokens": per * facts.images})


def carried(request: Request) -> frozenset[str]:
    """The modalities ("vision", "audio") a chat request's parts need, read from the parts' types alone: nothing is
    decoded or fetched to say it."""
    if request.engine_path != CHAT:
        return frozenset()
    body = request.body if request.body is not None else request.parsed
    return needed_modalities(media_parts(body))


def refuse_unless_projector(catalog: CatalogState, model: str, needed: frozenset[str]) -> None:
    """Refused (400) when the stored model `model` lacks a projector for the modalities a request's parts need (a
    model not in this store, a remote engine's or another node's, answers for itself)."""
    known = projector_modalities(catalog, model)
    if needed and known is not None:
        check_projector(model, known[0], known[1], needed)


def _rewrite(body: dict[str, Any], parts: dict[tuple[int, int], dict[str, Any]]) -> dict[str, Any]:
    """A copy of `body` with the parts at (message, part) replaced; the client's body is never changed."""
    messages = list(body["messages"])
    for (i, j), part in parts.items():
        message = dict(messages[i])
        content = list(message["content"])
        content[j] = part
        message["content"] = content
        messages[i] = message
    return {**body, "messages": messages}


def _data_url(url: str, where: str) -> tuple[str, bytes]:
    """(declared media type, bytes) of a base64 data: URL."""
    head, sep, data = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise DialectError(f"{where}: a data: URL must be base64 (data:image/png;base64,...)", code="invalid_image")
    try:
        raw = base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise DialectError(f"{where}: the data: URL is not valid base64", code="invalid_image") from None
    return head[5:-7].strip().lower(), raw


class _Checker:
    """Each part in turn, within the request's bounds; what it found, for the log."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.max_bytes = settings.inputs.image_max_mib << 20
        self.max_pixels = settings.inputs.image_max_megapixels * 1_000_000
        self.bytes = self.pixels = self.fetched = self.audio_bytes = 0
        self.types: list[str] = []
        self.audio_formats: list[str] = []

    def _count(self, n: int, where: str) -> None:
        self.bytes += n
        if self.bytes > self.max_bytes:
            raise DialectError(f"{where}: the request's images and audio come to over "
                               f"{self.s.inputs.image_max_mib} MiB (inputs.image_max_mib)", code="image_too_large")

    async def image(self, part: dict[str, Any], where: str) -> dict[str, Any] | None:
        spec = part.get("image_url")
        url = spec.get("url") if isinstance(spec, dict) else spec
        if not isinstance(url, str) or not url:
            raise DialectError(f"{where}.image_url.url: expected a data: URL or an http(s) URL")
        fetched = False
        if url.startswith("data:"):
            declared, raw = _data_url(url, f"{where}.image_url.url")
        elif url.startswith(("http://", "https://")):
            if not self.s.inputs.image_fetch:
                raise DialectError(f"{where}.image_url.url: http(s) image URLs are not fetched here (image_fetch is "
                                   f"off); send the image as a base64 data: URL", code="image_fetch_disabled")
            raw = await fetch_image(url, max_bytes=self.max_bytes - self.bytes,
                                    timeout_s=self.s.inputs.image_fetch_timeout_s,
                                    allow_hosts=self.s.inputs.image_fetch_allow_hosts)
            declared, fetched = "", True
            self.fetched += 1
        else:
            raise DialectError(f"{where}.image_url.url: expected a data: URL or an http(s) URL", code="invalid_image")
        self._count(len(raw), where)
        info = await asyncio.to_thread(inspect_image, raw, where=where, max_pixels=self.max_pixels)
        self.pixels += info.pixels
        if self.pixels > self.max_pixels:
            raise DialectError(f"{where}: the request's images come to {self.pixels / 1e6:.1f} Mpx, over the "
                               f"{self.s.inputs.image_max_megapixels} Mpx allowed (inputs.image_max_megapixels)",
                               code="image_too_large")
        self.types.append(info.media_type)
        if not fetched and declared == info.media_type:
            return None  # as it came: the engine gets the client's bytes
        url = f"data:{info.media_type};base64,{base64.b64encode(raw).decode('ascii')}"
        return {**part, "image_url": {**spec, "url": url} if isinstance(spec, dict) else {"url": url}}

    async def audio(self, part: dict[str, Any], where: str) -> dict[str, Any] | None:
        spec = part.get("input_audio")
        data = spec.get("data") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(data, str):
            raise DialectError(f"{where}.input_audio: expected {{data: base64, format: wav|mp3}}")
        try:
            raw = base64.b64decode("".join(data.split()), validate=True)
        except (binascii.Error, ValueError):
            raise DialectError(f"{where}.input_audio.data: not valid base64", code="invalid_audio") from None
        self._count(len(raw), where)
        fmt = inspect_audio(raw, where=f"{where}.input_audio.data")
        self.audio_bytes += len(raw)
        self.audio_formats.append(fmt)
        return None if spec.get("format") == fmt else {**part, "input_audio": {**spec, "format": fmt}}

    def facts(self) -> MediaFacts:
        return MediaFacts(images=len(self.types), image_types=self.types, image_bytes=self.bytes - self.audio_bytes,
                          image_pixels=self.pixels, images_fetched=self.fetched, audio_clips=len(self.audio_formats),
                          audio_formats=self.audio_formats, audio_bytes=self.audio_bytes)

