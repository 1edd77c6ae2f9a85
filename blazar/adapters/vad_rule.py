"""The turn rule of the Realtime API's `server_vad`, over a voice-activity model's speech probabilities: when speech
starts (a window at or above `threshold`) and when it stops (`silence_duration_ms` of windows below the lower
threshold), with the positions the protocol reports. Pure: windows in, events out, no model and no clock.

Positions are milliseconds of the session's input audio. `audio_start_ms` is the first speech window's start less
`prefix_padding_ms` (never before 0): the start of the audio the turn's item holds, as the protocol says.
`audio_end_ms` is where the silence reached `silence_duration_ms`: the end of the audio committed, which includes
the silence (as the protocol's `speech_stopped` says). The hysteresis (speech ends below `threshold - 0.15`, as
Silero's own segmenter does) keeps a syllable's dip from ending a turn."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from blazar.errors import DialectError

_HYSTERESIS = 0.15
_MAX_MS = 60_000  # a minute of padding or silence is no turn detection a session could mean


@dataclass(frozen=True, slots=True)
class ServerVad:
    """`turn_detection: {"type": "server_vad", ...}`'s parameters, with the API's defaults."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    # What the session does on a turn (the detector only reports it): respond at a stop, cancel a response at a start.
    create_response: bool = True
    interrupt_response: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be between 0.0 and 1.0, not {self.threshold}")
        for name in ("prefix_padding_ms", "silence_duration_ms"):
            if not 0 <= getattr(self, name) <= _MAX_MS:
                raise ValueError(f"{name} must be between 0 and {_MAX_MS}, not {getattr(self, name)}")


def server_vad(spec: Mapping[str, object] | None) -> ServerVad | None:
    """A session's `turn_detection` as the detector's parameters, the API's defaults for what it leaves out; None (no
    turn detection: the client commits) for null. DialectError (`invalid_turn_detection`) says what is wrong: a type
    Blazar does not run (`semantic_vad` needs a hosted model), an unknown field, a value of the wrong type or range."""
    if spec is None:
        return None
    if spec.get("type") != "server_vad":
        raise _refused(f"turn_detection type {spec.get('type')!r} is not supported here: use 'server_vad' or null")
    unknown = sorted(set(spec) - _FIELDS)
    if unknown:
        raise _refused(f"turn_detection has no field {unknown[0]!r}")
    d = ServerVad()
    try:
        return ServerVad(threshold=_number(spec, "threshold", d.threshold),
                         prefix_padding_ms=_int(spec, "prefix_padding_ms", d.prefix_padding_ms),
                         silence_duration_ms=_int(spec, "silence_duration_ms", d.silence_duration_ms),
                         create_response=_bool(spec, "create_response", d.create_response),
                         interrupt_response=_bool(spec, "interrupt_response", d.interrupt_response))
    except ValueError as e:
        raise _refused(f"turn_detection: {e}") from None


# idle_timeout_ms is the session's own timer, not the detector's: accepted, read by the session.
_FIELDS = {"type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response", "interrupt_response",
           "idle_timeout_ms"}


def _refused(message: str) -> DialectError:
    return DialectError(message, code="invalid_turn_detection")


def _number(spec: Mapping[str, object], name: str, default: float) -> float:
    value = spec.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} has the wrong type: {value!r}")
    return float(value)


def _int(spec: Mapping[str, object], name: str, default: int) -> int:
    value = spec.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} has the wrong type: {value!r}")
    return value


def _bool(spec: Mapping[str, object], name: str, default: bool) -> bool:
    value = spec.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{name} has the wrong type: {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class SpeechPaused:
    """The speech has been quiet for `pause_ms` (a rule asked for pauses): the turn may be ending. `audio_ms`: where
    the quiet began. Told once per quiet run; a turn that goes on is told `SpeechResumed`."""

    audio_ms: int


@dataclass(frozen=True, slots=True)
class SpeechResumed:
    audio_ms: int


VadEvent = SpeechStarted | SpeechStopped | SpeechPaused | SpeechResumed


class TurnRule:
    """One session's state: in speech or not, and since when the silence has lasted."""

    def __init__(self, params: ServerVad, pause_ms: int | None = None) -> None:
        self.params = params
        self._low = max(params.threshold - _HYSTERESIS, 0.01)
        self.speaking = False
        self._silence_from: int | None = None  # ms where the current run of non-speech windows began
        # Quiet this long within speech is told as a pause (None: never), when shorter than the silence that ends it.
        self.pause_ms = pause_ms if pause_ms is not None and pause_ms < params.silence_duration_ms else None
        self._paused = False

    def window(self, probability: float, start_ms: int, end_ms: int) -> VadEvent | None:
        """The event that the window [start_ms, end_ms) with this speech probability decides, if any."""
        if not self.speaking:
            if probability >= self.params.threshold:
                self.speaking, self._silence_from = True, None
                return SpeechStarted(max(0, start_ms - self.params.prefix_padding_ms))
            return None
        if probability >= self._low:
            self._silence_from = None  # still speech (a dip between the two thresholds does not start a silence)
            if self._paused:
                self._paused = False
                return SpeechResumed(start_ms)
            return None
        if self._silence_from is None:
            self._silence_from = start_ms
        if end_ms - self._silence_from >= self.params.silence_duration_ms:
            self.speaking, self._silence_from, self._paused = False, None, False
            return SpeechStopped(end_ms)
        if self.pause_ms is not None and not self._paused and end_ms - self._silence_from >= self.pause_ms:
            self._paused = True
            return SpeechPaused(self._silence_from)
        return None
