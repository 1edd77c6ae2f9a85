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
