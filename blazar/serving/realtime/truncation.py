"""What the client heard of an assistant's audio: `conversation.item.truncate` cuts an audio item at `audio_end_ms`
(its transcript to the words heard by the sentences' timing, blazar/serving/realtime/voicing.py `heard`), so the next
response's chat reads only what the user heard; `output_audio_buffer.clear` is the WebRTC/SIP connections' (the
server holds no output buffer over a WebSocket), answered with an error that says so."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from blazar.errors import RealtimeEventInvalid
from blazar.serving.realtime.events import TruncateAsked, error, event
from blazar.serving.realtime.voicing import AudioItem, heard

if TYPE_CHECKING:
    from blazar.serving.realtime.session import RealtimeSession


async def truncate(session: RealtimeSession, data: dict[str, Any], eid: str | None) -> None:
    try:
        asked = TruncateAsked.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        raise RealtimeEventInvalid(".".join(str(p) for p in first["loc"]), first["msg"]) from None
    item = next((i for i in session.items if i["id"] == asked.item_id), None)
    if item is None:
        await session.send(error(f"no item {asked.item_id!r} in the conversation", code="item_not_found",
                                 param="item_id", event_id=eid))
        return
    audio = session.spoken.get(asked.item_id)
    if audio is None or asked.content_index != 0:
        raise RealtimeEventInvalid("content_index" if audio is not None else "item_id",
                                   "only an assistant audio item's audio (content_index 0) can be truncated")
    if asked.audio_end_ms > math.ceil(audio.audio_ms):
        raise RealtimeEventInvalid("audio_end_ms", f"{asked.audio_end_ms} ms is past the item's audio "
                                                   f"({audio.audio_ms:.0f} ms)")
    kept = heard(audio.said, asked.audio_end_ms)
    session.spoken[asked.item_id] = AudioItem(kept, min(audio.audio_ms, asked.audio_end_ms))
    item["content"] = [{"type": "output_audio", "transcript": "".join(s.text for s in kept)}]
    await session.send(event("conversation.item.truncated", item_id=asked.item_id, content_index=0,
                             audio_end_ms=asked.audio_end_ms))


def no_output_buffer(session: RealtimeSession) -> Callable[[dict[str, Any], str | None], Awaitable[None]]:
    async def answer(data: dict[str, Any], eid: str | None) -> None:
        await session.send(error("output_audio_buffer.clear is for WebRTC and SIP connections: over a WebSocket the "
                                 "client holds the audio it was sent; stop playing it, then send "
                                 "conversation.item.truncate with what was heard", code="unsupported_event",
                                 event_id=eid))
    return answer
