"""Remote engines: any server that speaks the OpenAI API (vLLM, SGLang, another Blazar, a vendor) registered for
some model names. Only the *name* of the environment variable that holds its API key is recorded, never the key.
Its circuit opening and closing (health checks and failed requests) are events too. Stream `remote:<name>`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from blazar.events.base import Event
from blazar.events.bounds import NAME, REMOTE_MODELS_MAX, URL, Text, items
from blazar.events.types import register


class _RemoteEvent(Event):
    name: str

    def stream_key(self) -> str:
        return f"remote:{self.name}"


@register
class RemoteAdded(_RemoteEvent):
    """A remote engine for `models` at `url` (its OpenAI API root, without /v1). Added again: replaced."""

    TYPE = "remote.added"
    AUDIT = True

    url: Annotated[str, URL]
    models: Annotated[list[str], items(REMOTE_MODELS_MAX, NAME)]
    api_key_env: str | None = None  # the environment variable the daemon reads the key from, at each request
    max_concurrent: int = Field(default=4, ge=1, le=10_000)


@register
class RemoteRemoved(_RemoteEvent):
    """The remote is forgotten: its model names no longer route to it."""

    TYPE = "remote.removed"
    AUDIT = True


# What saw the remote fail: its health check, or a request sent to it.
CircuitSource = Literal["health_check", "request"]


@register
class RemoteCircuitOpened(_RemoteEvent):
    """Requests to the remote are refused (503 remote_unavailable) until `open_until`, after `failures` in a row."""

    TYPE = "remote.circuit_opened"

    failures: int
    reason: Text
    source: CircuitSource
    open_until: float


@register
class RemoteCircuitClosed(_RemoteEvent):
    """A health check (or a request let through after the cool-down) succeeded: the remote serves again."""

    TYPE = "remote.circuit_closed"

    latency_ms: float | None = None
