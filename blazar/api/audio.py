"""OpenAI's audio API: POST /v1/audio/transcriptions and /v1/audio/translations (speech to text, served by a
model of the whisper kind), POST /v1/audio/speech (text to speech, a model of the piper kind) and GET
/v1/audio/voices (the piper voices in the store and their speakers).

Thin resources like every inference route: the upload is streamed to a temporary file under the home as it arrives
(bounded by `max_audio_mib`: 413) and handed to the same pipeline as chat (`Gateway.serve`: the key's scope, the
model's kind and the key's limits first; only then is the audio probed, as the request's `prepare`: not audio 400,
decoded past `max_audio_s` 400; then admission, keep-alive, eviction, the crash circuit, the trace) as a multipart
body for the model's whisper child, with the bound it decodes to. Speech is made by blazar/serving/speech.py
sentence by sentence and streamed as it is encoded. Sessions do not apply. Errors take OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import falcon
import falcon.asgi
from falcon.media.multipart import MultipartParseError
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from blazar.adapters import audio as codec
from blazar.adapters.engines.kinds import BEAM_FIELD, MAX_AUDIO_FIELD
from blazar.api import disconnect
from blazar.api.auth import Access, principal_of
from blazar.api.bounds import MAX_NAME_CHARS, check_name, shown
from blazar.api.proxy import Proxy, read_json
from blazar.api.routes import ENGINE, Deps, Op, Route
from blazar.api.schemas import BOOL, JSON, NUM, OBJ, SSE, STR, TEXT, listed, obj
from blazar.context import Blazar
from blazar.errors import DialectError
from blazar.queries.voices import voices
from blazar.serving import speech
from blazar.serving.gateway import Gateway
from blazar.serving.request import AudioAsked, Hooks, Request

TRANSCRIPTION_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
CHUNK = 1 << 20
FORM_OVERHEAD = 64 << 10  # the form's boundaries and small fields beside the file
MAX_FIELD_CHARS = 4096  # a prompt, a language: text fields are small
# A language code as whisper takes it (en, haw, zh-Hans): recorded in request.audio, so never free text.
_LANGUAGE = re.compile(r"[A-Za-z]{2,8}(?:[-_][A-Za-z0-9]{1,8}){0,2}")
UPLOAD_ROUTES = ("/v1/audio/transcriptions", "/v1/audio/translations")


def path_limits(max_audio_mib: int) -> dict[str, int]:
    """The body bound of the upload routes (the middleware's, before routing): the audio bound, not max_body_mib."""
    return {route: (max_audio_mib << 20) + FORM_OVERHEAD for route in UPLOAD_ROUTES}


def uploads_dir(app: Blazar) -> Path:
    d = app.paths.data_dir / "uploads"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


class _Upload:
    """The form as it came: its text fields, and its file written to a temporary file under the home."""

    def __init__(self) -> None:
        self.fields: dict[str, list[str]] = {}
        self.path: Path | None = None
        self.filename = "audio"
        self.file_type = "application/octet-stream"
        self.bytes = 0

    def one(self, name: str) -> str | None:
        values = self.fields.get(name)
        return values[-1] if values else None

    def discard(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


async def _read_form(req: falcon.asgi.Request, directory: Path, limit: int) -> _Upload:
    """Stream the multipart form: the file part to disk (past `limit` bytes: 413), the rest kept as text."""
    if req.content_type is None or not req.content_type.startswith("multipart/form-data"):
        raise DialectError("upload the audio as multipart/form-data with the fields `file` and `model`")
    up = _Upload()
    try:
        form: Any = await req.get_media()
        async for part in form:
            if part.name == "file" and up.path is None:
                up.filename = "".join(c for c in (part.filename or "audio") if c.isprintable())[:255] or "audio"
                up.file_type = part.content_type or up.file_type
                fd, name = tempfile.mkstemp(prefix="audio-", dir=directory)
                up.path = Path(name)
                with os.fdopen(fd, "wb") as out:
                    async for chunk in part.stream:
                        up.bytes += len(chunk)
                        if up.bytes > limit:
                            raise falcon.HTTPContentTooLarge(
                                description=f"the audio file is over the limit of {limit >> 20} MiB "
                                            "(inputs.max_audio_mib)",
                                headers={"Connection": "close"})
                        await asyncio.to_thread(out.write, chunk)
            elif part.name:
                text = await part.get_text() or ""
                if len(text) > MAX_FIELD_CHARS:
                    raise DialectError(f"the form field {part.name[:40]!r} is over {MAX_FIELD_CHARS} characters")
                up.fields.setdefault(part.name, []).append(text)
    except MultipartParseError as e:
        up.discard()
        raise DialectError(f"the multipart form is malformed: {e.description}") from None
    except BaseException:
        up.discard()
        raise
    return up


def _multipart(up: _Upload, data: bytes, max_audio_s: float) -> tuple[str, bytes]:
    """The form again, for the whisper child: its fields as the client sent them, the bound the child decodes to
    (`max_audio_s`: it stops there too, whatever the file says of itself) and the file's bytes."""
    return whisper_form(up.fields, up.filename, up.file_type, data, max_audio_s)


def whisper_form(fields: dict[str, list[str]], filename: str, file_type: str, data: bytes,
                 max_audio_s: float, beam_size: int | None = None) -> tuple[str, bytes]:
    """A multipart form for a whisper child (its content type and body): the text fields, the bound the child
    decodes to (and, for a realtime turn, its beams), and the file. Also a realtime session's transcription
    (blazar/api/realtime_hear.py). The gateway's own fields are never taken from the caller's."""
    boundary = uuid.uuid4().hex
    out: list[bytes] = []
    kept = {name: values for name, values in fields.items() if name not in (MAX_AUDIO_FIELD, BEAM_FIELD)}
    own = [(MAX_AUDIO_FIELD, [repr(float(max_audio_s))])] + ([(BEAM_FIELD, [str(beam_size)])] if beam_size else [])
    for name, values in [*kept.items(), *own]:
        for value in values:
            out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
                       + value.encode() + b"\r\n")
    safe = filename.replace('"', "'")
    out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{safe}"\r\n'
               f"Content-Type: {file_type}\r\n\r\n".encode() + data + b"\r\n")
    out.append(f"--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}", b"".join(out)


def _no_session(request: Request) -> Request:
    """Sessions keep a conversation's KV cache in a llama-server slot: an audio request has none to keep."""
    if request.session is not None:
        raise DialectError("sessions (X-Blazar-Session) do not apply to the audio routes")
    return request


class Transcriptions(Proxy):
    """POST /v1/audio/transcriptions (and, with `route = "translations"`, /v1/audio/translations)."""

    multipart = True  # the edge lets this route's forms through (blazar/api/edge.py)
    route: Literal["transcriptions", "translations"] = "transcriptions"

    def __init__(self, gateway: Gateway, app: Blazar) -> None:
        super().__init__(gateway)
        self.app = app

    def ask(self, data: dict[str, Any]) -> Request:
        """A JSON body is no upload: this route reads a multipart form (on_post, `_asked`)."""
        raise DialectError("upload the audio as multipart/form-data with the fields `file` and `model`")

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        settings = self.app.settings()
        up = await _read_form(req, uploads_dir(self.app), settings.inputs.max_audio_mib << 20)
        try:
            asked, fields = await self._asked(up, settings.inputs.max_audio_s)
            request = _no_session(self.request_of(req, resp, asked, b"", fields))
            watcher = disconnect.watch(req)
            try:
                answer = await self.gateway.serve(request, watcher)
            except BaseException:
                disconnect.stop(watcher)
                raise
        finally:
            up.discard()
        self.render(req, resp, answer)

    async def _asked(self, up: _Upload, max_audio_s: float) -> tuple[Request, dict[str, Any]]:
        """Check the form and the audio, and say what the whisper child is asked."""
        if up.path is None:
            raise DialectError("the form has no `file` part", code="invalid_request")
        model = up.one("model")
        if not model:
            raise DialectError("the form has no `model` field", code="invalid_request")
        check_name(model)
        language = up.one("language") or None
        if language is not None and not _LANGUAGE.fullmatch(language):
            raise DialectError(f"language {shown(language)} is not a language code (ISO-639-1, such as en or de)")
        fmt = up.one("response_format") or "json"
        if fmt not in TRANSCRIPTION_FORMATS:
            raise DialectError(f"response_format {fmt[:40]!r} is not one of {', '.join(TRANSCRIPTION_FORMATS)}")
        stream_text = (up.one("stream") or "false").lower()
        if stream_text not in ("true", "false"):
            raise DialectError("stream must be true or false")
        stream = stream_text == "true"
        if stream and self.route == "translations":
            raise DialectError("translations do not stream (OpenAI's API has no stream for them)")
        temperature = up.one("temperature")
        if temperature is not None:
            try:
                t = float(temperature)
            except ValueError:
                t = -1.0
            if not 0.0 <= t <= 1.0:
                raise DialectError("temperature must be a number from 0 to 1")
        path = up.path

        async def measured(request: Request) -> Request:
            """The audio decoded and measured (not audio, NotAudio, or longer than max_audio_s, AudioTooLong, the
            moment decoding passes it: a 400, recorded; the length is what decoding found, never what the file
            states), and the form framed for the whisper child with the bound it decodes to: only once the key's
            scope, the model's kind and the key's limits allow the request (Gateway.serve)."""
            info = await asyncio.to_thread(codec.probe, path, max_duration_s=max_audio_s)
            data = await asyncio.to_thread(path.read_bytes)
            content_type, body = _multipart(up, data, max_audio_s)
            assert request.audio is not None
            return replace(request, raw=body, content_type=content_type, hooks=replace(request.hooks, prepare=None),
                           audio=replace(request.audio, audio_seconds=info.duration_s))

        fields: dict[str, Any] = {k: v[-1] for k, v in up.fields.items()}
        asked = Request(model=model, engine_path=f"/v1/audio/{self.route}", body=None, stream=stream, raw=b"",
                        hooks=Hooks(prepare=measured), audio=AudioAsked(route=self.route, response_format=fmt,
                                                           input_bytes=up.bytes, language=language))
        return asked, fields


class Translations(Transcriptions):
    route = "translations"


class SpeechBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI's `instructions` and what may come: accepted, unused

    model: StrictStr = Field(min_length=1, max_length=MAX_NAME_CHARS)
    input: StrictStr = Field(min_length=1)
    voice: StrictStr | None = Field(None, max_length=MAX_NAME_CHARS)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: StrictFloat | StrictInt = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio"] = "audio"  # OpenAI's "sse" is not offered: the audio itself streams


class Speech(Proxy):
    """POST /v1/audio/speech: the text spoken by a piper voice, streamed in the format asked."""

    def __init__(self, gateway: Gateway, app: Blazar) -> None:
        super().__init__(gateway)
        self.app = app

    def ask(self, data: dict[str, Any]) -> Request:
        body = SpeechBody.model_validate(data)
        limit = self.app.settings().inputs.max_speech_chars
        if len(body.input) > limit:
            raise DialectError(f"the input is {len(body.input)} characters; the limit is {limit} "
                               "(inputs.max_speech_chars)")
        if not codec.split_sentences(body.input):
            raise DialectError("the input has nothing to say (no letters or digits)", code="invalid_request")
        produce = speech.producer(self.gateway, body.input, body.response_format, float(body.speed), body.voice)

        async def voiced(request: Request) -> Request:
            """The voice checked against the model's speakers once the key's scope and the model's kind allow the
            request: a key learns nothing of the speakers of a voice outside its scope."""
            self._check_voice(body.model, body.voice)
            return replace(request, hooks=replace(request.hooks, prepare=None))

        # The engine path names the route (the kind check reads it); piper is asked sentence by sentence by `produce`.
        return Request(model=body.model, engine_path="/v1/audio/speech", body=None, stream=True,
                       hooks=Hooks(produce=produce, prepare=voiced),
                       audio=AudioAsked(route="speech", response_format=body.response_format,
                                        input_chars=len(body.input), voice=body.voice))

    def _check_voice(self, model: str, voice: str | None) -> None:
        """A multi-speaker voice speaks as one of its speakers: another name is a 400 naming them, never piper's
        default in silence. A single-speaker voice takes any name (OpenAI's clients always send one: `alloy`)."""
        known = next((v for v in voices(self.app) if model in (v["id"], v["model"])), None)
        speakers = known["speakers"] if known is not None else []
        if voice and speakers and voice not in speakers:
            more = " ..." if len(speakers) > 20 else ""
            raise DialectError(f"voice {voice[:60]!r} is not a speaker of {model!r}; its speakers: "
                               f"{', '.join(speakers[:20])}{more}", code="invalid_request")

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raw, data = await read_json(req)
        asked = self.ask(data)
        check_name(asked.model)
        request = _no_session(self.request_of(req, resp, asked, raw, data))
        self.render(req, resp, await self.gateway.serve(request, None))


class Voices:
    """GET /v1/audio/voices: every piper voice in the store, with its speakers (the `voice` a request may name)."""

    def __init__(self, app: Blazar) -> None:
        self.app = app

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        p = principal_of(req)  # a key sees only the voices in its scope, as /v1/models lists only its models
        resp.media = {"object": "list", "data": [v for v in voices(self.app) if p is None or p.allows(v["model"])]}


def clear_uploads(app: Blazar) -> int:
    """Remove what a daemon that died mid-request left in the uploads directory (someone's audio: it is kept only
    while its request runs). Called once as the routes are made, before any request; returns how many."""
    d = app.paths.data_dir / "uploads"
    gone = 0
    for left in d.glob("audio-*") if d.is_dir() else ():
        left.unlink(missing_ok=True)
        gone += 1
    return gone


def _upload(kind: type[Transcriptions]) -> Callable[[Deps], Transcriptions]:
    def make(d: Deps) -> Transcriptions:
        d.shared(clear_uploads)  # once, before the first upload route takes a request
        return kind(d.gateway, d.app)
    return make


_FORM = obj(["file", "model"], file={"type": "string", "format": "binary"}, model=STR, language=STR, prompt=STR,
            response_format={"enum": list(TRANSCRIPTION_FORMATS)}, temperature=NUM,
            **{"timestamp_granularities[]": {"type": "array", "items": {"enum": ["word", "segment"]}}}, stream=BOOL)
_TEXT = obj(["text"], text=STR)
ROUTES = (
    Route("/v1/audio/transcriptions", Access.KEY, _upload(Transcriptions), {"post": Op(
        "Speech to text (a whisper model)", _TEXT, statuses=(*ENGINE, 413), ok_types=(JSON, TEXT, SSE),
        engine_errors=True, form=_FORM)}),
    Route("/v1/audio/translations", Access.KEY, _upload(Translations), {"post": Op(
        "Speech to English text (a whisper model)", _TEXT, statuses=(*ENGINE, 413), ok_types=(JSON, TEXT, SSE),
        engine_errors=True, form=_FORM)}),
    Route("/v1/audio/speech", Access.KEY, lambda d: Speech(d.gateway, d.app), {"post": Op(
        "Text to speech (a piper voice), streamed as it is made", statuses=ENGINE, body=SpeechBody,
        engine_errors=True,
        ok_types=("audio/mpeg", "audio/opus", "audio/aac", "audio/flac", "audio/wav", "audio/pcm"))}),
    Route("/v1/audio/voices", Access.KEY, lambda d: Voices(d.app), {"get": Op(
        "The piper voices in the store and their speakers", listed(OBJ))}),
)
