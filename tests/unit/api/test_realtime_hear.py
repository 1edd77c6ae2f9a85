"""GatewayHear: a session's turn as an internal transcription request (a whisper form with a WAV made in memory),
and the refusals it turns into RealtimeHearRefused, against a fake gateway."""

from __future__ import annotations

import io
import wave
from typing import Any

import orjson
import pytest

from blazar.adapters.engines.kinds import BEAM_FIELD, MAX_AUDIO_FIELD
from blazar.api.realtime_caller import Caller
from blazar.api.realtime_hear import GatewayHear
from blazar.errors import LimitExceeded, RealtimeHearRefused
from blazar.serving.request import Answer, Request


class Whisper:
    def __init__(self, answer: Answer | None = None, refuse: Exception | None = None) -> None:
        self.answer, self.refuse = answer, refuse
        self.asked: list[Request] = []

    async def serve(self, request: Request, watcher: object = None) -> Answer:
        self.asked.append(request)
        if self.refuse is not None:
            raise self.refuse
        assert self.answer is not None
        return self.answer


def hear(gateway: Any) -> GatewayHear:
    return GatewayHear(Caller(gateway, None, "127.0.0.1", "sdk", str), "whisper-base", 30.0)


def form_part(body: bytes, name: str) -> bytes:
    head = f'name="{name}"'.encode()
    after = body.split(head, 1)[1]
    return after.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n--", 1)[0].split(b"\r\n--")[0]


async def test_a_turn_is_a_transcription_request_with_a_wav_of_the_audio() -> None:
    g = Whisper(Answer(status=200, data=orjson.dumps({"text": " Hello there. "}), headers={"x-audio-language": "en"}))
    pcm = bytes(range(256)) * 125  # 32000 bytes: one second at 16 kHz
    heard = await hear(g).transcribe(pcm, language="en", prompt="Paris")
    assert heard.text == "Hello there." and heard.audio_s == 1.0 and heard.trace_id == g.asked[0].trace_id
    r = g.asked[0]
    assert (r.model, r.engine_path, r.path, r.stream) == ("whisper-base", "/v1/audio/transcriptions",
                                                          "/v1/realtime", False)
    assert r.audio is not None and r.audio.audio_seconds == 1.0 and r.audio.language == "en"
    assert r.content_type is not None and r.content_type.startswith("multipart/form-data; boundary=")
    assert form_part(r.raw, "language") == b"en" and form_part(r.raw, "prompt") == b"Paris"
    assert form_part(r.raw, MAX_AUDIO_FIELD) == b"30.0"
    assert form_part(r.raw, BEAM_FIELD) == b"1"  # greedy: a turn is waited for
    assert heard.language == "en"  # what whisper heard it in: the session's later turns are told it
    wav = r.raw.split(b"Content-Type: audio/wav\r\n\r\n", 1)[1]
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16_000, 1, 2)
        assert w.readframes(w.getnframes()) == pcm


@pytest.mark.parametrize(("gateway", "code"), [
    (Whisper(refuse=LimitExceeded("key k used 60.0 s of audio today", limit="daily_audio_s", value=60,
                                    retry_after_s=1.0)),
     "rate_limit_exceeded"),
    (Whisper(Answer(status=400, refused=b"{}", refusal=("not audio", "invalid_request_error"))), "engine_error"),
    (Whisper(Answer(status=200, data=b"[]")), "engine_error"),
])
async def test_a_refusal_is_a_hear_refusal_with_its_code(gateway: Whisper, code: str) -> None:
    with pytest.raises(RealtimeHearRefused) as refused:
        await hear(gateway).transcribe(bytes(3200), language=None, prompt=None)
    assert refused.value.code == code
