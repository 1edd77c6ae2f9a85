"""What a realtime session asks of the world: a chat answered as text deltas and usage (`ChatPort`: the gateway in
the daemon, a fake in unit tests), and a way to send the client an event (`Send`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int
    output_tokens: int


class ChatPort(Protocol):
    def chat(self, body: dict[str, Any]) -> AsyncIterator[str | Usage]:
        """The answer to an OpenAI chat body (streamed): its text deltas, then its usage. Raises RealtimeChatRefused."""
        ...



@dataclass(frozen=True, slots=True)
class Heard:
    """A transcription of a committed turn: its text, the trace id of its internal request and its wall time."""

    text: str
    trace_id: str
    ms: float
    audio_s: float  # the seconds of audio it heard (the item's usage)


class HearPort(Protocol):
    async def transcribe(self, pcm16_16k: bytes, *, language: str | None, prompt: str | None) -> Heard:
        """The words of 16 kHz mono PCM16 audio. Raises RealtimeHearRefused (a limit, the scope, the engine)."""
        ...


@dataclass(frozen=True, slots=True)
class Absent:
    """Why a session lacks a capability (no model in the store, none in the key's scope): the `error` an ask gets."""

    code: str
    message: str
