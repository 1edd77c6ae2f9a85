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


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a function call the chat makes (its stream's `delta.tool_calls[]`): `index` says which call; the
    id and name come with a call's first piece, the arguments (JSON text) in pieces."""

    index: int
    call_id: str | None
    name: str | None
    arguments: str


class ChatPort(Protocol):
    def chat(self, body: dict[str, Any]) -> AsyncIterator[str | Usage | ToolCallDelta]:
        """The answer to an OpenAI chat body (streamed): its text deltas and tool-call pieces, then its usage. Raises
        RealtimeChatRefused."""
        ...

