"""What a realtime session asks of the world: a chat answered as text deltas and usage (`ChatPort`: the gateway in
the daemon, a fake in unit tests), and a way to send the client an event (`Send`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from blazar.serving.realtime.facts import TurnFacts

Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a function call the chat makes (its stream's `delta.tool_calls[]`): `index` says which call; the
    id and name come with a call's first piece, the arguments (JSON text) in pieces."""

    index: int
    call_id: str | None
    name: str | None
    arguments: str


class ChatWatch(Protocol):
    """What a response hears of its chat on the way, before any text: the chat request's own trace id, and its
    place when it waits for a slot. Called on the loop; neither may block."""

    def chat_began(self, trace_id: str) -> None: ...

    def chat_queued(self, position: int, depth: int) -> None: ...


class ChatPort(Protocol):
    def chat(self, body: dict[str, Any], watch: ChatWatch | None = None) -> AsyncIterator[str | Usage | ToolCallDelta]:
        """The answer to an OpenAI chat body (streamed): its text deltas and tool-call pieces, then its usage.
        Raises RealtimeChatRefused.
        `watch` is told the chat's trace id and its queue position (blazar.response.queued)."""
        ...


class TurnRecorder(Protocol):
    def record(self, facts: TurnFacts) -> None:
        """A turn ended: its `realtime.turn` event appended (the daemon: through the request writer). Never blocks."""
        ...



@dataclass(frozen=True, slots=True)
class SpokenChunk:
    """One sentence spoken: its audio (16-bit mono PCM at `rate`, the voice's own), the sentence as it was given,
    and the trace id of the speech request that made it."""

    pcm: bytes
    rate: int
    text: str
    trace_id: str


class SpeakPort(Protocol):
    """A session's voice: `voice` (the piper model), `speaker` (the session's default speaker, a profile's; None: the
    voice's own), `speakers` (a multi-speaker voice's; empty for one speaker)."""

    voice: str
    speaker: str | None
    speakers: tuple[str, ...]

    def speak(self, sentences: AsyncIterator[str], *, speaker: str | None,
              speed: float) -> AsyncIterator[SpokenChunk]:
        """Each sentence spoken as it comes, one chunk per sentence in order, through ONE speech request (its
        limits, admission and trace). Closing the iterator ends the request. Raises RealtimeSpeechRefused."""
        ...


@dataclass(frozen=True, slots=True)
class Heard:
    """A transcription of a committed turn: its text, the trace id of its internal request and its wall time."""

    text: str
    trace_id: str
    ms: float
    audio_s: float  # the seconds of audio it heard (the item's usage)
    language: str | None = None  # the language whisper heard (given or detected), as an ISO code


class HearPort(Protocol):
    async def transcribe(self, pcm16_16k: bytes, *, language: str | None, prompt: str | None) -> Heard:
        """The words of 16 kHz mono PCM16 audio. Raises RealtimeHearRefused (a limit, the scope, the engine)."""
        ...


@dataclass(frozen=True, slots=True)
class Absent:
    """Why a session lacks a capability (no model in the store, none in the key's scope): the `error` an ask gets."""

    code: str
    message: str
