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
        return Answer(status=200, content_type=codec.CONTENT_TYPES[fmt],
                      headers={SAMPLE_RATE_HEADER: str(codec.OUT_RATE),
                               "cache-control": "no-cache"},
                      stream=_stream(gateway, call, first, sentences[1:], fmt, speed, voice))

    return produce


async def _stream(gateway: Gateway, call: Call, first: Spoken, rest: list[str], fmt: str, speed: float,
                  voice: str | None) -> AsyncIterator[bytes]:
    encoder = codec.SpeechEncoder(fmt, first.rate)
    seconds = 0.0
    try:
        spoken: Spoken | None = first
        pending = iter(rest)
        while spoken is not None:
            seconds += spoken.seconds
            out = await asyncio.to_thread(encoder.feed, spoken.pcm)
            if out:
                yield out
            sentence = next(pending, None)
            spoken = None if sentence is None else await _synthesize(gateway, call, sentence, speed, voice)
        tail = await asyncio.to_thread(encoder.finish)
        if tail:
            yield tail
        call.audio_measured(seconds)
        call.finish(Completed(200, {}))
    except Refused as e:
        # NOTE: the status line went out with the first sentence: the stream stops short; the failure is recorded.
        call.finish(Failed(502, "engine_error", e.message))
    except BaseException:
        call.finish(Failed(499, "client_disconnected", "the client closed the connection while speech was sent"))
        raise


def _settle_with_task(call: Call) -> None:
    """An answer whose stream never starts (the client gone before the first byte) still ends the call, with the
    task that serves the request."""
    task = asyncio.current_task()
    if task is not None:
        task.add_done_callback(lambda _: call.finish(
            Failed(499, "client_disconnected", "the request ended before its audio was sent")))
