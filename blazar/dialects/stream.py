"""What a dialect's stream translator is, and how the engine's SSE bytes are cut into events for it.

The engine (llama-server) always answers in OpenAI's shape: `chat.completion.chunk` (or a `/v1/completions` chunk)
events on a stream. A dialect that is not OpenAI's turns each parsed chunk into its own wire format (Anthropic's
SSE events, Ollama's NDJSON lines); the gateway reads usage from the same parsed chunks, so every dialect records
the same request events.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson


class Translator(Protocol):
    """Turns the engine's OpenAI-shaped stream into one dialect's stream. Stateful: one per request."""

    @property
    def content_type(self) -> str:
        """The media type of the dialect's stream (read-only: a wrapper may pass on its inner translator's)."""
        ...

    def event(self, chunk: dict[str, Any]) -> bytes:
        """One engine chunk (parsed JSON) → the bytes to send now (b"" when nothing is due yet)."""
        ...

    def heartbeat(self) -> bytes:
        """The engine has been silent a while (reading a long prompt): bytes that keep the client waiting, in the
        dialect's own form (b"" where it has none)."""
        ...

    def end(self) -> bytes:
        """The engine's stream is over (`[DONE]` or its end): whatever closes the dialect's stream."""
        ...

    def error(self, message: str) -> bytes:
        """The engine's stream broke after the headers were sent: the dialect's in-stream error."""
        ...


class SseEvents:
    """Cuts a byte stream into the JSON payloads of its `data:` lines, across block boundaries. `[DONE]` and
    comments are dropped; a payload that is not JSON is skipped (the engine never sends one)."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, block: bytes) -> list[dict[str, Any]]:
        data = self._rest + block if self._rest else block
        cut = data.rfind(b"\n")
        if cut < 0:
            self._rest = data
            return []
        self._rest = data[cut + 1:]
        out = []
        for line in data[:cut].split(b"\n"):
            if line.startswith(b"data: {") or line.startswith(b"data:{"):
                try:
                    out.append(orjson.loads(line[5:]))
                except orjson.JSONDecodeError:
                    continue
        return out


def sse(chunk: dict[str, Any]) -> bytes:
    """One OpenAI-style SSE event."""
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def named_sse(event: str, payload: dict[str, Any]) -> bytes:
    """One SSE event with a name (Anthropic's style)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def ndjson(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload) + b"\n"
