"""Audio request events: what a speech request's audio was (its seconds, format, voice) and how fast it was made,
recorded once per request beside its terminal event. Like every request event it goes through the group-commit
writer; content (the audio, the text) is never recorded, only sizes and timings.
"""

from __future__ import annotations

from typing import Literal

from blazar.events.requests import _RequestEvent
from blazar.events.types import register

AudioRoute = Literal["transcriptions", "translations", "speech"]


@register
class RequestAudio(_RequestEvent):
    """A speech request's audio: seconds heard (speech to text) or made (text to speech), the format, and the
    real-time factor (processing seconds per audio second: under 1 is faster than real time)."""

    TYPE = "request.audio"

    model: str
    kind: str  # the engine kind that served it: whisper, piper
    route: AudioRoute
    audio_seconds: float
    response_format: str  # json, text, srt, vtt, verbose_json; mp3, opus, aac, flac, wav, pcm
    processing_ms: float  # from the request reaching its engine to its last byte
    real_time_factor: float | None = None  # processing_ms / 1000 / audio_seconds (None for no audio)
    input_bytes: int | None = None  # the upload's size (speech to text)
    input_chars: int | None = None  # the text's length (text to speech)
    language: str | None = None
    voice: str | None = None
    streamed: bool = False
