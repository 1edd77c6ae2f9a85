"""A realtime session's `conversation.item.create` and `.delete`: the conversation's items as the client adds and
removes them. A text message, a function call or its output joins at once; a user message of one `input_audio` part
is heard as the input buffer's turns are (blazar/serving/realtime/hearing.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blazar.errors import RealtimeEventInvalid
from blazar.serving.realtime.events import ItemAsked, error, event, new_id
from blazar.serving.realtime.tools import function_item

if TYPE_CHECKING:
    from blazar.serving.realtime.session import RealtimeSession


async def create(session: RealtimeSession, item: ItemAsked, eid: str | None) -> None:
    send = session.send
    if item.type == "message" and item.role is None:
        raise RealtimeEventInvalid("item.role", "a message has a role: user, assistant or system")
    if any(p.type == "input_audio" for p in item.content):
        await _create_audio(session, item, eid)
        return
    if any(p.type in ("input_image", "output_audio") for p in item.content):
        await send(error("item.content: images and assistant audio are not served", code="audio_not_supported",
                         param="item.content", event_id=eid))
        return
    if await refused_full(session, eid):
        return
    if _taken(session, item.id):
        await send(error(f"item {item.id!r} exists already", code="item_exists", param="item.id", event_id=eid))
        return
    part = "input_text" if item.role != "assistant" else "output_text"
    stored = {"id": item.id or new_id("item"), "object": "realtime.item", "type": "message",
              "status": "completed", "role": item.role,
              "content": [{"type": part, "text": p.text or ""} for p in item.content]} if item.type == "message" \
        else function_item(item.model_dump() | {"id": item.id or new_id("item")}, session.items)
    await join(session, stored)


async def refused_full(session: RealtimeSession, eid: str | None) -> bool:
    """Whether the conversation holds all the items it may (told as `conversation_full`)."""
    if len(session.items) < session.bounds.max_items:
        return False
    await session.send(error(f"the conversation holds {session.bounds.max_items} items at most "
                             "(realtime.max_items); delete some first", code="conversation_full", event_id=eid))
    return True


async def join(session: RealtimeSession, item: dict[str, Any]) -> None:
    """`item` joins the end of the conversation, told as added and done."""
    previous = session.items[-1]["id"] if session.items else None
    session.items.append(item)
    await session.send(event("conversation.item.added", previous_item_id=previous, item=item))
    await session.send(event("conversation.item.done", previous_item_id=previous, item=item))


async def _create_audio(session: RealtimeSession, item: ItemAsked, eid: str | None) -> None:
    """A user message of one `input_audio` part: heard as the buffer's turns are."""
    if session.hearing is None:
        await session.send(error(f"item.content: {session.hear_absent.message}", code=session.hear_absent.code,
                                 param="item.content", event_id=eid))
    elif item.role != "user" or len(item.content) != 1:
        await session.send(error("item.content: an input_audio part is a user message's only part",
                                 code="invalid_value", param="item.content", event_id=eid))
    elif _taken(session, item.id):
        await session.send(error(f"item {item.id!r} exists already", code="item_exists", param="item.id",
                                 event_id=eid))
    else:
        part = item.content[0].model_extra or {}
        transcript = part.get("transcript")
        await session.hearing.create_item(item.id or new_id("item"), part.get("audio"),
                                          transcript if isinstance(transcript, str) else None, eid)


async def delete(session: RealtimeSession, data: dict[str, Any], eid: str | None) -> None:
    item_id = data.get("item_id")
    kept = [i for i in session.items if i["id"] != item_id]
    if len(kept) == len(session.items):
        await session.send(error(f"no item {item_id!r} in the conversation", code="item_not_found",
                                 param="item_id", event_id=eid))
        return
    session.items = kept
    await session.send(event("conversation.item.deleted", item_id=item_id))


def _taken(session: RealtimeSession, item_id: str | None) -> bool:
    return item_id is not None and any(i["id"] == item_id for i in session.items)
