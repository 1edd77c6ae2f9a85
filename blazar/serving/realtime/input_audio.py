"""A realtime session's `audio.input` settings as `session.update` asks them: the format (blazar/dialects/
realtime_audio.py), the turn detection (blazar/adapters/vad_rule.py `server_vad`: null is off, the client commits),
the transcription (`model`, `language`, `prompt`: the model named is reported, the session's own whisper model hears)
and the noise reduction (none is run: null only). Pure: the settings asked are checked whole before any is used."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from blazar.adapters.vad_rule import ServerVad, server_vad
from blazar.dialects.realtime_audio import PCM, AudioFormat, audio_format
from blazar.errors import AudioFormatError, DialectError

MAX_PROMPT_CHARS = 4096  # as a transcription form's text field (blazar/api/audio.py)
# A language code as whisper takes it (en, haw, zh-Hans), as the transcription route checks it.
_LANGUAGE = re.compile(r"[A-Za-z]{2,8}(?:[-_][A-Za-z0-9]{1,8}){0,2}")
DEFAULT_VAD = ServerVad()  # the API's default: server_vad with its defaults
_FIELDS = {"format", "turn_detection", "transcription", "noise_reduction"}


@dataclass(frozen=True, slots=True)
class InputSettings:
    format: AudioFormat = PCM
    vad: ServerVad | None = DEFAULT_VAD
    language: str | None = None
    prompt: str | None = None

    def view(self, stt: str) -> dict[str, Any]:
        """`audio.input` as `session.created`/`session.updated` show it; `stt` is the whisper model that hears."""
        v = self.vad
        detection = None if v is None else {
            "type": "server_vad", "threshold": v.threshold, "prefix_padding_ms": v.prefix_padding_ms,
            "silence_duration_ms": v.silence_duration_ms, "create_response": v.create_response,
            "interrupt_response": v.interrupt_response}
        transcription: dict[str, Any] = {"model": stt}
        if self.language is not None:
            transcription["language"] = self.language
        if self.prompt is not None:
            transcription["prompt"] = self.prompt
        return {"format": self.format.session_value(), "transcription": transcription, "noise_reduction": None,
                "turn_detection": detection}


def updated(current: InputSettings, spec: Any) -> InputSettings:
    """`current` with what `audio.input` (`spec`) asks. DialectError (its `code`, the message naming the field) for
    anything Blazar cannot do as asked; nothing changes then."""
    if not isinstance(spec, dict):
        raise DialectError("session.audio.input: an object", code="invalid_value")
    unknown = sorted(set(spec) - _FIELDS)
    if unknown:
        raise DialectError(f"session.audio.input has no field {unknown[0][:40]!r}", code="invalid_value")
    new = current
    if "format" in spec:
        try:
            new = replace(new, format=audio_format(spec["format"]))
        except AudioFormatError as e:
            raise DialectError(f"session.audio.input.format: {e}", code=e.code) from None
    if "turn_detection" in spec:
        detection = spec["turn_detection"]
        if detection is not None and not isinstance(detection, dict):
            raise DialectError("session.audio.input.turn_detection: an object or null", code="invalid_turn_detection")
        try:
            new = replace(new, vad=server_vad(detection))
        except DialectError as e:
            raise DialectError(f"session.audio.input.{e}", code=e.code) from None
    if spec.get("noise_reduction") is not None:
        raise DialectError("session.audio.input.noise_reduction: Blazar runs no noise reduction; leave it null",
                           code="noise_reduction_not_supported")
    if "transcription" in spec:
        new = _transcription(new, spec["transcription"])
    return new


def _transcription(current: InputSettings, spec: Any) -> InputSettings:
    if spec is None:  # the API's "no transcription": Blazar's chat model reads the words, so it always transcribes
        return replace(current, language=None, prompt=None)
    if not isinstance(spec, dict):
        raise DialectError("session.audio.input.transcription: an object or null", code="invalid_value")
    model, language, prompt = spec.get("model"), spec.get("language"), spec.get("prompt")
    if model is not None and (not isinstance(model, str) or len(model) > 256):
        raise DialectError("session.audio.input.transcription.model: a model name", code="invalid_value")
    if language is not None and (not isinstance(language, str) or not _LANGUAGE.fullmatch(language)):
        raise DialectError("session.audio.input.transcription.language: a language code (ISO-639-1, such as en)",
                           code="invalid_value")
    if prompt is not None and (not isinstance(prompt, str) or len(prompt) > MAX_PROMPT_CHARS):
        raise DialectError(f"session.audio.input.transcription.prompt: text of {MAX_PROMPT_CHARS} characters at "
                           "most", code="invalid_value")
    return replace(current, language=language or None, prompt=prompt or None)
