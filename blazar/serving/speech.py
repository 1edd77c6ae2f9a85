"""Text to speech on the pipeline: a `/v1/audio/speech` request, once admitted to its piper child (Gateway.generate
calls the Request's `produce`), is spoken sentence by sentence through piper's /synthesize and each sentence's audio
is encoded and sent as soon as it is made, so the first sound reaches the client after one sentence, not the whole
text. The call ends when the last byte is sent (its audio seconds and real-time factor in `request.audio`), when a
sentence fails (the stream stops; the failure recorded), or when the client hangs up.
"""

from __future__ import annotations

import asyncio
import io
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from blazar.adapters import audio as codec
from blazar.adapters.engines.answers import refusal
from blazar.errors import OWNER_SEES, EngineError, Refused
from blazar.serving.call import Call, Completed, Failed
from blazar.serving.request import Answer

if TYPE_CHECKING:
    from blazar.serving.gateway import Gateway

SAMPLE_RATE_HEADER = "x-audio-sample-rate"


@dataclass(frozen=True, slots=True)
class Spoken:
    """One sentence's audio as piper made it: 16-bit PCM, its rate and channels."""

    pcm: bytes
    rate: int
    channels: int
    width: int

    @property
    def seconds(self) -> float:
        return len(self.pcm) / (self.rate * self.channels * self.width)


def _pcm_of(wav: bytes) -> Spoken:
    with wave.open(io.BytesIO(wav), "rb") as w:
        return Spoken(w.readframes(w.getnframes()), w.getframerate(), w.getnchannels(), w.getsampwidth())


async def _synthesize(gateway: Gateway, call: Call, text: str, speed: float, voice: str | None) -> Spoken:
    """One sentence through the call's piper child. Its refusal, a broken answer or one that is no WAV: Refused
    (502, in OpenAI's shape)."""
    inst = call.instance
    assert inst is not None
    body: dict[str, Any] = {"text": text, "length_scale": round(codec.length_scale_for(speed), 4)}
    if voice:
        body["speaker"] = voice  # a multi-speaker voice's speaker (the route checked it is one)
    try:
        upstream = await gateway.client.open(inst.base_url, "/synthesize", orjson.dumps(body), api_key=inst.api_key)
        try:
            data = await upstream.aread()
        finally:
            await upstream.aclose()
    except EngineError as e:
        raise Refused(f"the piper child did not answer: {e.message}", reason="engine_error", http_status=502,
                      public=f"{call.model}'s voice did not answer; try again ({OWNER_SEES})") from None
    if upstream.status_code >= 400:
        # NOTE: piper's answer is the owner's to read (its server's error page; its log has the traceback).
        raise Refused(f"the piper child refused the text ({upstream.status_code}): {refusal(data)[0]}",
                      reason="engine_error", http_status=502,
                      public=f"{call.model}'s voice could not speak this text ({OWNER_SEES})")
    try:
        return await asyncio.to_thread(_pcm_of, data)
    except (wave.Error, EOFError) as e:
        raise Refused(f"the piper child's answer is not WAV audio: {e}", reason="engine_error", http_status=502,
                      public=f"{call.model}'s voice answered with no audio ({OWNER_SEES})") from None


def producer(gateway: Gateway, text: str, fmt: str, speed: float,
             voice: str | None) -> Callable[[Call], Awaitable[Answer]]:
    """What Gateway.generate runs once the call holds a slot of its piper child: the first sentence made before the
    answer starts (a failure then is a clean error, not a broken stream), the rest as the stream goes."""

    async def produce(call: Call) -> Answer:
        sentences = codec.split_sentences(text)  # never empty: the route refused an input with nothing to say
        first = await _synthesize(gateway, call, sentences[0], speed, voice)
        call.first_token()
        _settle_with_task(call)
        spoken = _spoken(gateway, call, first, _each(sentences[1:]), speed, voice)
        return Answer(status=200, content_type=codec.CONTENT_TYPES[fmt],
                      headers={SAMPLE_RATE_HEADER: str(codec.OUT_RATE),
                               "cache-control": "no-cache"},
                      stream=_stream(call, spoken, codec.SpeechEncoder(fmt, first.rate)))

    return produce


def live_producer(gateway: Gateway, first: str, rest: AsyncIterator[str], speed: float,
                  voice: str | None) -> Callable[[Call], Awaitable[Answer]]:
    """`producer` for a text still being written (a realtime response's): `first`, then each sentence of `rest` as
    it comes, every one answered as its own chunk of raw 16-bit PCM at the voice's rate (SAMPLE_RATE_HEADER), one
    chunk per sentence. Ended early (the response cancelled, the connection gone), the audio made so far is still
    the call's, and charged."""

    async def produce(call: Call) -> Answer:
        spoken = await _synthesize(gateway, call, first.strip(), speed, voice)
        call.first_token()
        _settle_with_task(call)
        return Answer(status=200, content_type=codec.CONTENT_TYPES["pcm"],
                      headers={SAMPLE_RATE_HEADER: str(spoken.rate)},
                      stream=_stream(call, _spoken(gateway, call, spoken, rest, speed, voice), None))

    return produce


async def _each(sentences: list[str]) -> AsyncIterator[str]:
    for sentence in sentences:
        yield sentence


async def _spoken(gateway: Gateway, call: Call, first: Spoken, rest: AsyncIterator[str], speed: float,
                  voice: str | None) -> AsyncIterator[Spoken]:
    yield first
    async for sentence in rest:
        yield await _synthesize(gateway, call, sentence.strip(), speed, voice)


async def _stream(call: Call, spoken: AsyncIterator[Spoken], encoder: codec.SpeechEncoder | None
                  ) -> AsyncIterator[bytes]:
    """The audio as it is made: encoded (`encoder`), or each sentence's raw PCM as one chunk (None: a realtime
    response's, whose audio made before an early end is charged as a stream's tokens are)."""
    seconds = 0.0
    try:
        async for one in spoken:
            seconds += one.seconds
            if encoder is None:
                yield one.pcm
                continue
            out = await asyncio.to_thread(encoder.feed, one.pcm)
            if out:
                yield out
        tail = await asyncio.to_thread(encoder.finish) if encoder is not None else b""
        if tail:
            yield tail
        call.audio_measured(seconds)
        call.finish(Completed(200, {}))
    except Refused as e:
        # NOTE: the status line went out with the first sentence: the stream stops short; the failure is recorded.
        call.finish(Failed(502, "engine_error", e.message, relayed_audio_s=_made(encoder, seconds)))
    except BaseException:
        call.finish(Failed(499, "client_disconnected", "the client closed the connection while speech was sent",
                           relayed_audio_s=_made(encoder, seconds)))
        raise


def _made(encoder: codec.SpeechEncoder | None, seconds: float) -> float | None:
    return seconds if encoder is None else None  # NOTE: the /v1/audio/speech route's stream keeps its old charging


def _settle_with_task(call: Call) -> None:
    """An answer whose stream never starts (the client gone before the first byte) still ends the call, with the
    task that serves the request."""
    task = asyncio.current_task()
    if task is not None:
        task.add_done_callback(lambda _: call.finish(
            Failed(499, "client_disconnected", "the request ended before its audio was sent")))
