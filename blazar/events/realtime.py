"""Realtime profiles: which three models serve a `/v1/realtime` session whose `model` names the profile (the whisper
model that hears, the chat model that answers, the piper voice that speaks) and the voice's speaker. Admin
configuration, like a model's settings. Stream `realtime:<name>`."""

from __future__ import annotations

from blazar.events.base import Event
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
