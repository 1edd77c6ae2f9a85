"""One Realtime connection's session (text in, text out): its settings, its conversation, and the response running,
driven by the client's events one at a time (`RealtimeSession.receive`). A response is a chat asked through the
`ChatPort` (blazar/api/realtime.py: the gateway's own pipeline, as the caller) and streamed back as the protocol's
events; `response.cancel` or the connection ending cancels it, which cancels the engine request under it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from blazar.errors import DialectError, RealtimeEventInvalid
from blazar.serving.realtime.events import (
    AUDIO_EVENTS,
    HEAR_EVENTS,
    ItemAsked,
    ResponseAsked,
    SessionAsked,
    error,
    event,
    new_id,
)
from blazar.serving.realtime.hearing import Hearing
from blazar.serving.realtime.input_audio import InputSettings, updated
from blazar.serving.realtime.port import Absent, ChatPort, HearPort, Send
from blazar.serving.realtime.turn import Turn

M = TypeVar("M", bound=BaseModel)
NO_WHISPER = Absent("audio_not_supported", "this session has no whisper model to hear audio: blazar pull whisper-base")

@dataclass(frozen=True, slots=True)
class Bounds:
    max_items: int
    max_output_tokens: int
    max_buffer_s: float = 60.0  # inputs.realtime_max_buffer_s


@dataclass
class RealtimeSession:
    model: str
    chat: ChatPort
    send: Send
    bounds: Bounds
    id: str = field(default_factory=lambda: new_id("sess"))
    instructions: str = ""
    temperature: float | None = None
    max_output_tokens: int | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    running: asyncio.Task[None] | None = None
    turn: Turn | None = None
    llm: str | None = None  # the chat model that answers (a profile's); None: `model` itself
    stt: str | None = None  # the whisper model that hears (shown in the session's audio.input.transcription)
    hear: HearPort | None = None  # None: the session does not hear (why: `hear_absent`)
    hear_absent: Absent = NO_WHISPER
    hearing: Hearing | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.hear is not None:
            self.hearing = Hearing(self, self.hear, self.stt or "", self.bounds.max_buffer_s)

    def view(self) -> dict[str, Any]:
        """The session as `session.created`/`session.updated` show it (a RealtimeSessionCreateRequest)."""
        return {"type": "realtime", "object": "realtime.session", "id": self.id, "model": self.model,
                "instructions": self.instructions, "output_modalities": ["text"],
                "max_output_tokens": self.max_output_tokens if self.max_output_tokens is not None else "inf",
                "tools": [], "tool_choice": "auto",
                "audio": {"input": self.hearing.view() if self.hearing is not None else
                          InputSettings(vad=None).view(self.stt or "") | {"transcription": None}}}

    async def start(self) -> None:
        await self.send(event("session.created", session=self.view()))

    async def receive(self, text: str | bytes) -> None:
        """One client event. A bad one is answered with an `error` event; the session goes on."""
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            await self.send(error("the event is not JSON", code="invalid_json"))
            return
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            await self.send(error("an event is a JSON object with a string `type`", code="invalid_event"))
            return
        kind, eid = data["type"], data.get("event_id") if isinstance(data.get("event_id"), str) else None
        handler = self._handlers().get(kind)
        if kind in HEAR_EVENTS and self.hearing is None:
            await self.send(error(f"{kind}: {self.hear_absent.message}", code=self.hear_absent.code, event_id=eid))
        elif kind in AUDIO_EVENTS:
            await self.send(error(f"{kind}: audio output is not served yet", code="audio_not_supported",
                                  event_id=eid))
        elif handler is None:
            await self.send(error(f"unknown event type {kind!r}", code="unknown_event", param="type",
                                  event_id=eid))
        else:
            try:
                await handler(data, eid)
            except RealtimeEventInvalid as e:
                await self.send(error(f"{kind}: {e}", code="invalid_value", param=e.param, event_id=eid))

    def _handlers(self) -> dict[str, Callable[[dict[str, Any], str | None], Awaitable[None]]]:
        return {"session.update": self._update, "conversation.item.create": self._create,
                "conversation.item.delete": self._delete, "response.create": self._respond,
                "response.cancel": self._cancel, **(self.hearing_handlers() if self.hearing is not None else {})}

    def hearing_handlers(self) -> dict[str, Callable[[dict[str, Any], str | None], Awaitable[None]]]:
        h = self.hearing
        assert h is not None
        return {"input_audio_buffer.append": lambda data, eid: h.append(data.get("audio"), eid),
                "input_audio_buffer.commit": lambda data, eid: h.commit(eid),
                "input_audio_buffer.clear": lambda data, eid: h.clear()}

    async def _update(self, data: dict[str, Any], eid: str | None) -> None:
        asked = _model(SessionAsked, data.get("session"), "session")
        audio = asked.audio or {}
        if (asked.output_modalities and "audio" in asked.output_modalities) or audio.get("output"):
            await self.send(error("session.audio.output, output_modalities audio: audio output is not served yet",
                                  code="audio_not_supported", param="session.output_modalities", event_id=eid))
            return
        heard = None
        if audio.get("input") is not None:
            if self.hearing is None:
                await self.send(error(f"session.audio.input: {self.hear_absent.message}", code=self.hear_absent.code,
                                      param="session.audio.input", event_id=eid))
                return
            try:
                heard = updated(self.hearing.settings, audio["input"])
            except DialectError as e:
                await self.send(error(str(e), code=e.code, param="session.audio.input", event_id=eid))
                return
        if asked.tools:
            await self.send(error("session.tools: tools are not served in realtime sessions yet",
                                  code="tools_not_supported", param="session.tools", event_id=eid))
            return
        if heard is not None and self.hearing is not None:
            self.hearing.configure(heard)
        if asked.instructions is not None:
            self.instructions = asked.instructions
        if asked.temperature is not None:
            self.temperature = asked.temperature
        if asked.max_output_tokens is not None:
            self.max_output_tokens = self._tokens(asked.max_output_tokens)
        await self.send(event("session.updated", session=self.view()))

    def _tokens(self, asked: int | str) -> int:
        return self.bounds.max_output_tokens if asked == "inf" else min(int(asked), self.bounds.max_output_tokens)

    async def _create(self, data: dict[str, Any], eid: str | None) -> None:
        item = _model(ItemAsked, data.get("item"), "item")
        if item.type != "message" or item.role is None:
            await self.send(error(f"item.type {item.type}: function calls come with tools, not served yet",
                                  code="tools_not_supported", param="item.type", event_id=eid))
            return
        if any(p.type == "input_audio" for p in item.content):
            await self._create_audio(item, eid)
            return
        if any(p.type in ("input_image", "output_audio") for p in item.content):
            await self.send(error("item.content: images and assistant audio are not served", code="audio_not_supported",
                                  param="item.content", event_id=eid))
            return
        if len(self.items) >= self.bounds.max_items:
            await self.send(error(f"the conversation holds {self.bounds.max_items} items at most "
                                  "(realtime.max_items); delete some first", code="conversation_full",
                                  event_id=eid))
            return
        if item.id is not None and any(i["id"] == item.id for i in self.items):
            await self.send(error(f"item {item.id!r} exists already", code="item_exists", param="item.id",
                                  event_id=eid))
            return
        part = "input_text" if item.role != "assistant" else "output_text"
        stored = {"id": item.id or new_id("item"), "object": "realtime.item", "type": "message",
                  "status": "completed", "role": item.role,
                  "content": [{"type": part, "text": p.text or ""} for p in item.content]}
        previous = self.items[-1]["id"] if self.items else None
        self.items.append(stored)
        await self.send(event("conversation.item.added", previous_item_id=previous, item=stored))
        await self.send(event("conversation.item.done", previous_item_id=previous, item=stored))

    async def _create_audio(self, item: ItemAsked, eid: str | None) -> None:
        """A user message of one `input_audio` part: heard as the buffer's turns are (blazar/serving/realtime/
        hearing.py)."""
        if self.hearing is None:
            await self.send(error(f"item.content: {self.hear_absent.message}", code=self.hear_absent.code,
                                  param="item.content", event_id=eid))
        elif item.role != "user" or len(item.content) != 1:
            await self.send(error("item.content: an input_audio part is a user message's only part",
                                  code="invalid_value", param="item.content", event_id=eid))
        elif item.id is not None and any(i["id"] == item.id for i in self.items):
            await self.send(error(f"item {item.id!r} exists already", code="item_exists", param="item.id",
                                  event_id=eid))
        else:
            part = item.content[0].model_extra or {}
            transcript = part.get("transcript")
            await self.hearing.create_item(item.id or new_id("item"), part.get("audio"),
                                           transcript if isinstance(transcript, str) else None, eid)

    async def _delete(self, data: dict[str, Any], eid: str | None) -> None:
        item_id = data.get("item_id")
        kept = [i for i in self.items if i["id"] != item_id]
        if len(kept) == len(self.items):
            await self.send(error(f"no item {item_id!r} in the conversation", code="item_not_found",
                                  param="item_id", event_id=eid))
            return
        self.items = kept
        await self.send(event("conversation.item.deleted", item_id=item_id))

    async def _respond(self, data: dict[str, Any], eid: str | None) -> None:
        asked = _model(ResponseAsked, data.get("response") or {}, "response")
        if asked.output_modalities and "audio" in asked.output_modalities:
            await self.send(error("response.output_modalities: audio is not served yet (text only for now)",
                                  code="audio_not_supported", param="response.output_modalities", event_id=eid))
            return
        if self.running is not None and not self.running.done():
            await self.send(error("a response is already in progress", code="conversation_already_has_active_"
                                  "response", event_id=eid))
            return
        self._start(asked)

    async def respond_to_turn(self) -> None:
        """A turn heard with `create_response`: a response as `response.create` with the session's settings asks,
        unless one runs (a turn heard while it answers, with `interrupt_response` off)."""
        if self.running is None or self.running.done():
            self._start(ResponseAsked())

    def _start(self, asked: ResponseAsked) -> None:
        """The response as a task, set as the running one before anything awaits (a turn heard meanwhile sees it)."""
        turn = self.turn = Turn(self, new_id("resp"), asked.conversation == "none")
        self.running = asyncio.create_task(self._answer(turn, asked, list(self.items)))

    async def _answer(self, turn: Turn, asked: ResponseAsked, items: list[dict[str, Any]]) -> None:
        await turn.begin()
        if self.hearing is not None:  # the transcripts of the audio items it reads
            await self.hearing.settled()
        await turn.run(self.chat_body(asked, items))

    def chat_body(self, asked: ResponseAsked, items: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The chat the response asks: the instructions as the system message, then the conversation (`items`: as
        it was when the response was asked; an audio item by its transcript, left out when it has none)."""
        instructions = asked.instructions if asked.instructions is not None else self.instructions
        messages = [{"role": "system", "content": instructions}] if instructions else []
        for item in self.items if items is None else items:
            text = "".join(p.get("text") or p.get("transcript") or "" for p in item["content"])
            if text or not any(p["type"] == "input_audio" for p in item["content"]):
                messages.append({"role": item["role"], "content": text})
        limit = self._tokens(asked.max_output_tokens) if asked.max_output_tokens is not None else (
            self.max_output_tokens or self.bounds.max_output_tokens)
        body: dict[str, Any] = {"model": self.llm or self.model, "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True}, "max_tokens": limit}
        temperature = asked.temperature if asked.temperature is not None else self.temperature
        if temperature is not None:
            body["temperature"] = temperature
        return body

    async def _cancel(self, data: dict[str, Any], eid: str | None) -> None:
        if self.running is None or self.running.done():
            await self.send(error("no response is in progress", code="response_cancel_not_active", event_id=eid))
            return
        await self.stop()

    async def interrupt(self, audio_start_ms: int) -> None:
        """Speech started while a response runs (turn detection's `interrupt_response`): it is cancelled.
        # V2 replaces this (the assistant's audio truncated to what the client was sent)."""
        await self.stop()

    async def close(self) -> None:
        """The connection is gone: what runs is cancelled, the response and the transcriptions."""
        await self.stop()
        if self.hearing is not None:
            await self.hearing.close()

    async def stop(self) -> None:
        """Cancel the running response (its engine request with it) and wait for it to end."""
        task = self.running
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if self.turn is not None and not self.turn.ran:  # cancelled before its first step: it still ends
                await self.turn.cancelled_unrun()


def _model(cls: type[M], value: Any, name: str) -> M:
    """`value` checked as `cls`; a RealtimeEventInvalid names the first wrong field, from the event's own field
    `name`."""
    try:
        return cls.model_validate(value)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in (name, *first["loc"]))
        raise RealtimeEventInvalid(where, first["msg"]) from None

