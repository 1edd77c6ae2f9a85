"""A response's spoken answer: its sentences through the session's `SpeakPort` (one speech request), each chunk
resampled from the voice's rate to the session's output format (blazar/adapters/resample.py, no delay: a position is
the same in and out) and sent as `response.output_audio_transcript.delta` (the sentence, just before its audio: the
transcript flows with the audio, as OpenAI's does) and `response.output_audio.delta`s. It keeps the timeline of what
was sent (`Said`: each sentence's first and last millisecond of audio), which `conversation.item.truncate` cuts by
(`heard`). Also what a turn's trace records: the speech request's trace id, the first audio's delay, the seconds."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from blazar.adapters.resample import Pcm16Resampler
from blazar.dialects.realtime_audio import AudioFormat, encode_delta
from blazar.serving.realtime.port import SpeakPort

DELTA_MS = 500  # audio per output delta: small enough that what was sent when a response is cancelled is close
_WORD = re.compile(r"\S+\s*")

Emit = Callable[..., Awaitable[None]]  # (event type, **fields at the response's item and part)


@dataclass(frozen=True, slots=True)
class VoiceOut:
    """How a response speaks: the wire format, the speaker piper is asked for (None: the voice's own) and the
    speed (0.25-1.5)."""

    format: AudioFormat
    speaker: str | None
    speed: float


@dataclass(slots=True)
class Said:
    """One sentence of an assistant audio item: its text as the transcript has it, and where its audio lies."""

    text: str
    start_ms: float
    end_ms: float


@dataclass(slots=True)
class AudioItem:
    """An assistant audio item of the conversation: its sentences' timeline and its audio's length."""

    said: list[Said]
    audio_ms: float


def heard(said: list[Said], audio_ms: float) -> list[Said]:
    """The timeline cut at `audio_ms`: every sentence whose audio ends by then, and of the sentence it cuts, its
    words in proportion to the share of its audio heard (rounded down; none when its first word was not heard)."""
    out: list[Said] = []
    for s in said:
        if s.end_ms <= audio_ms:
            out.append(s)
            continue
        if s.start_ms < audio_ms:
            words = _WORD.findall(s.text)
            keep = int(len(words) * (audio_ms - s.start_ms) / (s.end_ms - s.start_ms))
            if keep:
                out.append(Said("".join(words[:keep]), s.start_ms, audio_ms))
        break
    return out


class Voicing:
    def __init__(self, port: SpeakPort, out: VoiceOut, emit: Emit) -> None:
        self.port = port
        self.out = out
        self.emit = emit
        self.said: list[Said] = []
        self.samples = 0  # samples of the output format sent
        self.began = time.monotonic()
        # What the turn's trace records (W's TurnFacts): the speech request, its first audio, what was spoken.
        self.speech_trace_id: str | None = None
        self.first_audio_ms: float | None = None  # from the response's start to its first audio delta sent
        self.first_audio_at: float | None = None  # its perf_counter instant (the turn's facts)

    @property
    def audio_ms(self) -> float:
        return self.samples * 1000 / self.out.format.rate

    @property
    def audio_out_s(self) -> float:
        return self.audio_ms / 1000

    @property
    def transcript(self) -> str:
        return "".join(s.text for s in self.said)

    async def speak(self, sentences: AsyncIterator[str]) -> None:
        """Speak `sentences` as they come, until they end (or the task is cancelled: the speech request ends too)."""
        resampler: Pcm16Resampler | None = None
        chunks = self.port.speak(sentences, speaker=self.out.speaker, speed=self.out.speed)
        try:
            async for chunk in chunks:
                if resampler is None:
                    resampler = Pcm16Resampler(chunk.rate, self.out.format.rate)
                self.speech_trace_id = chunk.trace_id
                await self.emit("response.output_audio_transcript.delta", delta=chunk.text)
                self.said.append(Said(chunk.text, self.audio_ms, self.audio_ms))
                await self._audio(resampler.feed(chunk.pcm))
        finally:  # NOTE: closed now, also when cancelled: it ends the speech request (its slot given back)
            if isinstance(chunks, AsyncGenerator):
                await chunks.aclose()
        if resampler is not None:
            await self._audio(resampler.flush())

    async def tail(self, text: str) -> None:
        """The rest of the answer's text that had nothing to say ("..."): in the transcript, with no audio."""
        if text:
            await self.emit("response.output_audio_transcript.delta", delta=text)
            self.said.append(Said(text, self.audio_ms, self.audio_ms))

    async def _audio(self, pcm: bytes) -> None:
        step = self.out.format.rate * DELTA_MS // 1000 * 2
        for at in range(0, len(pcm), step):
            piece = pcm[at:at + step]
            # NOTE: counted before it is sent: a cancel that lands while the send is awaited may find it sent.
            self.samples += len(piece) // 2
            if self.said:
                self.said[-1].end_ms = self.audio_ms
            if self.first_audio_ms is None:
                self.first_audio_ms = round((time.monotonic() - self.began) * 1000, 1)
                self.first_audio_at = time.perf_counter()
            await self.emit("response.output_audio.delta", delta=encode_delta(self.out.format, piece))
