"""Realtime profiles: which three models serve a `/v1/realtime` session whose `model` names the profile (the whisper
model that hears, the chat model that answers, the piper voice that speaks) and the voice's speaker. Admin
configuration, like a model's settings. Stream `realtime:<name>`.

And a session's turns (`realtime.turn`): request events, one per response, on the turn's own trace."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict

from blazar.events.base import Event
from blazar.events.bounds import ID, WORD
from blazar.events.requests import _RequestEvent
from blazar.events.types import register


class _ProfileEvent(Event):
    name: str

    def stream_key(self) -> str:
        return f"realtime:{self.name}"


@register
class RealtimeProfileSet(_ProfileEvent):
    """The realtime profile `name` is served by `stt` (a whisper model), `llm` (a llama-server model) and `tts` (a
    piper voice, speaking as `speaker` when it has several), each a model's own name in the store. Set again:
    replaced."""

    TYPE = "realtime.profile_set"
    AUDIT = True

    stt: str
    llm: str
    tts: str
    speaker: str | None = None  # one of a multi-speaker voice's speakers; None: the voice's default


@register
class RealtimeProfileRemoved(_ProfileEvent):
    """The realtime profile `name` is forgotten: a session asking for it is refused."""

    TYPE = "realtime.profile_removed"
    AUDIT = True


# -- a realtime session's turns --------------------------------------------------------------------------------------

TurnStatus = Literal["completed", "cancelled", "failed", "incomplete"]


class TurnVad(BaseModel):
    """What server VAD heard of the user's speech: positions in the session's input audio (ms), and the silence it
    waited for before it ended the turn (`silence_duration_ms`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    speech_started_ms: int | None = None
    speech_stopped_ms: int | None = None
    silence_ms: int | None = None


class TurnStep(BaseModel):
    """One internal request of a turn (a transcription, a chat, a speech): its own trace (`blazar why` tells it) and
    its times in ms from the turn's start. The counts are the step's own (tokens for a chat, audio seconds made for a
    speech)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    trace_id: Annotated[str, ID] | None = None
    done_ms: float | None = None  # the step's answer whole (a transcription's text)
    first_ms: float | None = None  # a chat's first token, a speech's first audio, as the session got them
    queue_position: int | None = None  # a chat that waited for a slot: its place when it queued (1 = next)
    tokens_in: int | None = None
    tokens_out: int | None = None
    audio_seconds: float | None = None


@register
class RealtimeTurn(_RequestEvent):
    """One turn of a `/v1/realtime` session (a response, with what the user said before it), recorded when it ends:
    the models, the internal requests under it (each with its own trace: `transcription`, `chat`, `speech`), and
    the timings in ms from the turn's start: the end of the user's speech as VAD heard it (a voice turn), else the
    arrival of `response.create`. Never content: no transcript, no text. The envelope's actor is the connection's
    key, as for its requests."""

    TYPE = "realtime.turn"
    # NOTE: kept in the live log (the schema's delete guard lets only request.* and node.heartbeat be archived;
    # archiving turns would take a migration of that guard).
    ARCHIVABLE = False

    session_id: Annotated[str, ID]
    response_id: Annotated[str, ID]
    index: int  # the turn's place in its session (0 = the first)
    model: str  # as the session asked: a realtime profile or a chat model
    llm: str  # the three models that serve the session (each a model's own name in the store)
    stt: str | None = None
    tts: str | None = None
    speaker: str | None = None
    tenant: str | None = None  # whose session it is (as request.received records it)
    status: TurnStatus
    error: Annotated[str, WORD] | None = None  # a failed turn's error code
    duration_ms: float  # from the turn's start to its end
    vad: TurnVad | None = None
    transcription: TurnStep | None = None
    chat: TurnStep | None = None
    speech: TurnStep | None = None
    audio_in_seconds: float | None = None  # the user's audio the turn heard
    cancelled_ms: float | None = None  # when it was cancelled (response.cancel, an interruption, the connection gone)
    audio_sent_ms: int | None = None  # a cancelled voice answer: the audio the client had been sent, in ms
