"""A realtime session's voice (`SpeakPort`): each spoken response is ONE internal /v1/audio/speech request of the
connection's caller through `Gateway.serve` (the key's scope and limits, daily_audio_s included; admission to the
piper child; the request's events and trace as any speech request's), whose producer (blazar/serving/speech.py
`live_producer`) speaks each sentence as the chat writes it. Closing the chunks ends the request: the slot is given
back and the audio made so far is charged."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from blazar.api.realtime_caller import Caller
from blazar.context import Blazar
from blazar.errors import BlazarError, RealtimeSpeechRefused
from blazar.ids import new_trace_id
from blazar.queries.realtime import DEFAULT_TTS, default_model, profile, session_models
from blazar.queries.voices import voices
from blazar.serving import speech
from blazar.serving.realtime.port import SpokenChunk
from blazar.serving.request import AudioAsked, Hooks

SPEECH = "/v1/audio/speech"


class GatewayVoice:
    def __init__(self, caller: Caller, voice: str, speaker: str | None, speakers: tuple[str, ...]) -> None:
        self.caller = caller
        self.voice = voice
        self.speaker = speaker
        self.speakers = speakers

    async def speak(self, sentences: AsyncIterator[str], *, speaker: str | None,
                    speed: float) -> AsyncIterator[SpokenChunk]:
        first = await anext(sentences, None)
        if first is None:
            return  # nothing to say: no speech request
        pending = deque([first])  # the sentences asked and not yet spoken, in order: one chunk each

        async def asked() -> AsyncIterator[str]:
            async for sentence in sentences:
                pending.append(sentence)
                yield sentence

        trace_id = new_trace_id()
        gateway = self.caller.gateway
        request = self.caller.request(
            model=self.voice, engine_path=SPEECH, body=None, stream=True, trace_id=trace_id,
            hooks=Hooks(produce=speech.live_producer(gateway, first, asked(), speed, speaker)),
            audio=AudioAsked(route="speech", response_format="pcm", voice=speaker))
        try:
            answer = await gateway.serve(request)
        except BlazarError as e:
            raise RealtimeSpeechRefused(self.caller.tell(e), e.code) from None
        stream = answer.stream
        if stream is None:
            raise RealtimeSpeechRefused(f"{self.voice}'s voice answered {answer.status}", "engine_error")
        rate = int(answer.headers[speech.SAMPLE_RATE_HEADER])
        try:
            async for pcm in stream:
                yield SpokenChunk(pcm, rate, pending.popleft(), trace_id)
        finally:  # NOTE: closed now, not when collected: it ends the speech call (its slot, its charge)
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()
        if pending:  # the stream stopped short: a sentence failed (recorded with the speech request)
            raise RealtimeSpeechRefused(f"{self.voice}'s voice could not speak the answer (blazar why {trace_id})",
                                        "engine_error")


def session_voice(app: Blazar, caller: Caller, model: str) -> tuple[GatewayVoice | None, str, str]:
    """The voice of a session asking for `model`, or None with the words why it has none and the code that tells
    them (the store has no voice; the key's scope leaves it out: model_not_allowed). A profile's voice and speaker
    (its scope was checked at connect, blazar/api/realtime.py `_models`), else the default voice."""
    try:
        if profile(app, model) is not None:
            models = session_models(app, model)
            tts, speaker = models.tts, models.speaker
        else:  # a chat model: the default voice, whether or not the store has a whisper model
            tts, speaker = default_model(app.runner.state("catalog"), "piper", DEFAULT_TTS), None
    except BlazarError as e:
        return None, f"this session has no voice: {caller.tell(e)}", "audio_not_supported"
    if caller.principal is not None and not caller.principal.allows(tts):
        return None, f"this session has no voice: the key's models do not include the voice {tts}", "model_not_allowed"
    known: dict[str, Any] = next((v for v in voices(app) if v["model"] == tts), {})
    return GatewayVoice(caller, tts, speaker, tuple(known.get("speakers") or ())), "", ""
