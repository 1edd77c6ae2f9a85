"""A realtime session's hearing in the daemon (`GatewayHear`, the session's `HearPort`): each committed turn is
transcribed as an internal /v1/audio/transcriptions request of the connection's caller through `Gateway.serve`, as
the transcription route asks its whisper child (blazar/api/audio.py `whisper_form`): the key's scope, its limits
(daily_audio_s counts the turn's seconds), admission, and a trace of its own in the log (`blazar why TRACE`).

The audio is the session's 16 kHz PCM16 as a WAV made in memory; its length is known, so no probe is needed."""

from __future__ import annotations

import io
import time
import wave

import orjson

from blazar.api.audio import whisper_form
from blazar.api.realtime_caller import Caller
from blazar.errors import BlazarError, RealtimeHearRefused
from blazar.ids import new_trace_id
from blazar.serving.gateway import AUDIO_LANGUAGE_HEADER
from blazar.serving.realtime.port import Heard
from blazar.serving.request import AudioAsked

TRANSCRIPTIONS = "/v1/audio/transcriptions"
RATE = 16_000
BEAMS = 1  # greedy: a realtime turn is waited for (about twice as fast as the child's default five beams)


def wav(pcm16: bytes, rate: int = RATE) -> bytes:
    """Mono 16-bit PCM as a WAV file's bytes."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16)
    return out.getvalue()


class GatewayHear:
    """A session's transcriptions, each an internal transcription request of the connection's caller."""

    def __init__(self, caller: Caller, model: str, max_audio_s: float) -> None:
        self.caller = caller
        self.model = model  # the session's whisper model
        self.max_audio_s = max_audio_s  # inputs.max_audio_s: the child decodes no further

    async def transcribe(self, pcm16_16k: bytes, *, language: str | None, prompt: str | None) -> Heard:
        started = time.perf_counter()
        seconds = len(pcm16_16k) / 2 / RATE
        fields = {"model": [self.model], "response_format": ["json"]}
        if language is not None:
            fields["language"] = [language]
        if prompt is not None:
            fields["prompt"] = [prompt]
        data = wav(pcm16_16k)
        content_type, body = whisper_form(fields, "turn.wav", "audio/wav", data, self.max_audio_s, BEAMS)
        trace_id = new_trace_id()
        request = self.caller.request(
            model=self.model, engine_path=TRANSCRIPTIONS, body=None, stream=False, raw=body, content_type=content_type,
            trace_id=trace_id, audio=AudioAsked(route="transcriptions", response_format="json", audio_seconds=seconds,
                                                input_bytes=len(data), language=language))
        try:
            answer = await self.caller.gateway.serve(request)
        except BlazarError as e:
            raise RealtimeHearRefused(self.caller.tell(e), e.code) from None
        if answer.status >= 400 or answer.data is None:
            message = answer.refusal[0] if answer.refusal else f"the whisper model answered {answer.status}"
            raise RealtimeHearRefused(message, "engine_error")
        try:
            text = orjson.loads(answer.data)["text"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise RealtimeHearRefused("the whisper model's answer has no text", "engine_error") from None
        return Heard(text=str(text).strip(), trace_id=trace_id, ms=(time.perf_counter() - started) * 1000,
                     audio_s=seconds, language=answer.headers.get(AUDIO_LANGUAGE_HEADER))
