"""A realtime session's output settings: `output_modalities` (`["audio"]`: the answer spoken, with its transcript;
`["text"]`: text only; the default is audio when the session has a voice) and `audio.output` (the wire format, the
voice, the speed), as `session.update` sets them and `response.create` overrides them for one response. Pure:
checked against the session's voice (`SpeakPort`: its speakers) and nothing else."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import Field, ValidationError

from blazar.dialects.realtime_audio import PCM, AudioFormat, audio_format
from blazar.errors import AudioFormatError, RealtimeEventInvalid
from blazar.serving.realtime.events import Loose
from blazar.serving.realtime.port import SpeakPort
from blazar.serving.realtime.voicing import VoiceOut

Modality = Literal["text", "audio"]


class OutputAsked(Loose):
    """`audio.output` as the protocol has it (the voice a name or `{"id": NAME}`; speed 0.25-1.5, the API's range)."""

    format: str | dict[str, Any] | None = None
    voice: str | dict[str, Any] | None = None
    speed: float | None = Field(default=None, ge=0.25, le=1.5)


@dataclass(frozen=True, slots=True)
class OutputSettings:
    modalities: tuple[str, ...] | None = None  # None: the default, audio when the session has a voice
    format: AudioFormat = PCM
    voice: str | None = None  # the name the client gave; None: the session's (a profile's speaker, or the voice's)
    speed: float = 1.0

    def resolved(self, speak: SpeakPort | None) -> list[str]:
        if self.modalities is not None:
            return list(self.modalities)
        return ["audio"] if speak is not None else ["text"]

    def view(self, speak: SpeakPort | None) -> dict[str, Any]:
        """`audio.output` as session.created/updated show it."""
        voice = self.voice or (speak.speaker or speak.voice if speak is not None else None)
        return {"format": self.format.session_value(), "voice": voice, "speed": self.speed}

    def voice_out(self, speak: SpeakPort) -> VoiceOut:
        """How a response speaks: a multi-speaker voice as the speaker named (else the session's); a single-speaker
        voice takes any name, as OpenAI clients always send one, and speaks as itself."""
        speaker = self.voice if speak.speakers and self.voice else speak.speaker
        return VoiceOut(self.format, speaker, self.speed)

    def with_asked(self, modalities: Sequence[str] | None, output: Any, speak: SpeakPort | None,
                   where: str) -> OutputSettings:
        """These settings with what an event asks (`where`: the event's field, `session` or `response`). A value
        that does not fit raises RealtimeEventInvalid naming it; nothing changes then."""
        new = self if modalities is None else replace(self, modalities=tuple(dict.fromkeys(modalities)))
        if output is None:
            return new
        try:
            asked = OutputAsked.model_validate(output)
        except ValidationError as e:
            first = e.errors()[0]
            raise RealtimeEventInvalid(".".join(str(p) for p in (where, "audio.output", *first["loc"])),
                                       first["msg"]) from None
        if asked.format is not None:
            try:
                new = replace(new, format=audio_format(asked.format))
            except AudioFormatError as e:
                raise RealtimeEventInvalid(f"{where}.audio.output.format", str(e)) from None
        if asked.voice is not None:
            new = replace(new, voice=_voice_name(asked.voice, speak, where))
        if asked.speed is not None:
            new = replace(new, speed=float(asked.speed))
        return new


def _voice_name(voice: str | dict[str, Any], speak: SpeakPort | None, where: str) -> str:
    name = voice.get("id") if isinstance(voice, dict) else voice
    param = f"{where}.audio.output.voice"
    if not isinstance(name, str) or not 0 < len(name) <= 128:
        raise RealtimeEventInvalid(param, "a voice is a name (or {\"id\": NAME}) of 1 to 128 characters")
    if speak is not None and speak.speakers and name not in speak.speakers:
        more = " ..." if len(speak.speakers) > 20 else ""
        raise RealtimeEventInvalid(param, f"voice {name[:60]!r} is not a speaker of {speak.voice!r}; its speakers: "
                                          f"{', '.join(speak.speakers[:20])}{more}")
    return name
