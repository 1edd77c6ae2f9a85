"""One Realtime connection's session: its settings, its conversation, and the response running, driven by the
client's events one at a time (`RealtimeSession.receive`). A response is a chat asked through the `ChatPort`
(blazar/api/realtime.py: the gateway's own pipeline, as the caller) and streamed back as the protocol's events, as
text or spoken through the `SpeakPort` (blazar/api/realtime_voice.py); `response.cancel`, an interruption or the
connection ending cancels it, which cancels the engine requests under it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from blazar.errors import RealtimeEventInvalid
from blazar.serving.realtime import truncation
from blazar.serving.realtime.events import AUDIO_EVENTS, ItemAsked, ResponseAsked, SessionAsked, error, event, new_id
from blazar.serving.realtime.output import OutputSettings
from blazar.serving.realtime.port import ChatPort, Send, SpeakPort, TurnRecorder
from blazar.serving.realtime.tools import (
    ToolChoice,
    chat_messages,
    chat_tools,
    checked_choice,
    checked_tools,
    function_item,
)
from blazar.serving.realtime.turn import Turn
from blazar.serving.realtime.voicing import AudioItem

M = TypeVar("M", bound=BaseModel)

@dataclass(frozen=True, slots=True)
class Bounds:
    max_items: int
    max_output_tokens: int
    max_tools: int = 128


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
    tools: list[dict[str, Any]] = field(default_factory=list)  # as the session shows them (the Realtime shape)
    tool_choice: ToolChoice = "auto"
    turns: int = 0  # responses begun: the next turn's index
    recorder: TurnRecorder | None = None  # each turn's `realtime.turn` (None: not recorded)

    speak: SpeakPort | None = None  # the session's voice; None: it has none (audio out is refused, `no_voice` says why)
    no_voice: str = "this session has no voice"
    no_voice_code: str = "audio_not_supported"  # model_not_allowed: the key's scope leaves the voice out
    output: OutputSettings = field(default_factory=OutputSettings)
    spoken: dict[str, AudioItem] = field(default_factory=dict)  # the assistant audio items' timelines, by item id

    def view(self) -> dict[str, Any]:
        """The session as `session.created`/`session.updated` show it (a RealtimeSessionCreateRequest)."""
        v: dict[str, Any] = {
            "type": "realtime", "object": "realtime.session", "id": self.id, "model": self.model,
            "instructions": self.instructions, "output_modalities": self.output.resolved(self.speak),
            "max_output_tokens": self.max_output_tokens if self.max_output_tokens is not None else "inf",
            "tools": self.tools, "tool_choice": self.tool_choice, "audio": {}}
        if self.speak is not None:
            v["audio"]["output"] = self.output.view(self.speak)
        return v

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
        if kind in AUDIO_EVENTS:
            await self.send(error(f"{kind}: audio is not served yet (Blazar's realtime sessions are text only for "
                                  "now)", code="audio_not_supported", event_id=eid))
        elif handler is None:
            await self.send(error(f"unknown event type {kind!r}", code="unknown_event", param="type",
                                  event_id=eid))
        else:
            try:
                await handler(data, eid)
            except RealtimeEventInvalid as e:
                await self.send(error(f"{kind}: {e}", code=type(e).code, param=e.param, event_id=eid))

    def _handlers(self) -> dict[str, Callable[[dict[str, Any], str | None], Awaitable[None]]]:
        return {"session.update": self._update, "conversation.item.create": self._create,
                "conversation.item.delete": self._delete, "response.create": self._respond,
                "response.cancel": self._cancel,
                "conversation.item.truncate": lambda d, e: truncation.truncate(self, d, e),
                "output_audio_buffer.clear": truncation.no_output_buffer(self)}

    async def _update(self, data: dict[str, Any], eid: str | None) -> None:
        asked = _model(SessionAsked, data.get("session"), "session")
        audio = asked.audio or {}
        if set(audio) - {"output"}:
            await self.send(error("session.audio.input: audio input is not served yet", code="audio_not_supported",
                                  param="session.audio.input", event_id=eid))
            return
        output = self.output.with_asked(asked.output_modalities, audio.get("output"), self.speak, "session")
        if not await self._voiced(output.resolved(self.speak), "session.output_modalities", eid):
            return
        tools = checked_tools(asked.tools, "session.tools", self.bounds.max_tools) if asked.tools is not None \
            else self.tools
        choice = checked_choice(asked.tool_choice if asked.tool_choice is not None else self.tool_choice, tools,
                                "session.tool_choice")
        self.tools, self.tool_choice = tools, choice
        if asked.instructions is not None:
            self.instructions = asked.instructions
        if asked.temperature is not None:
            self.temperature = asked.temperature
        if asked.max_output_tokens is not None:
            self.max_output_tokens = self._tokens(asked.max_output_tokens)
        self.output = output
        await self.send(event("session.updated", session=self.view()))

    async def _voiced(self, modalities: list[str], param: str, eid: str | None) -> bool:
        """Whether the session can answer in `modalities`; audio without a voice is told why."""
        if "audio" in modalities and self.speak is None:
            await self.send(error(f"{param} audio: {self.no_voice}", code=self.no_voice_code, param=param,
                                  event_id=eid))
            return False
        return True

    def _tokens(self, asked: int | str) -> int:
        return self.bounds.max_output_tokens if asked == "inf" else min(int(asked), self.bounds.max_output_tokens)

    async def _create(self, data: dict[str, Any], eid: str | None) -> None:
        item = _model(ItemAsked, data.get("item"), "item")
        if item.type == "message" and item.role is None:
            raise RealtimeEventInvalid("item.role", "a message has a role: user, assistant or system")
        if any(p.type in ("input_audio", "input_image", "output_audio") for p in item.content):
            await self.send(error("item.content: only text parts are served yet", code="audio_not_supported",
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
                  "content": [{"type": part, "text": p.text or ""} for p in item.content]} if item.type == "message" \
            else function_item(item.model_dump() | {"id": item.id or new_id("item")}, self.items)
        previous = self.items[-1]["id"] if self.items else None
        self.items.append(stored)
        await self.send(event("conversation.item.added", previous_item_id=previous, item=stored))
        await self.send(event("conversation.item.done", previous_item_id=previous, item=stored))

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
        output = self.output.with_asked(asked.output_modalities, (asked.audio or {}).get("output"), self.speak,
                                        "response")
        modalities = output.resolved(self.speak)
        if not await self._voiced(modalities, "response.output_modalities", eid):
            return
        if self.running is not None and not self.running.done():
            await self.send(error("a response is already in progress", code="conversation_already_has_active_"
                                  "response", event_id=eid))
            return
        body = self.chat_body(asked)
        out_of_band = asked.conversation == "none"
        voice = output.voice_out(self.speak) if "audio" in modalities and self.speak is not None else None
        self.turn = Turn(self, new_id("resp"), out_of_band, voice)
        await self.turn.begin()
        self.running = asyncio.create_task(self.turn.run(body))

    def chat_body(self, asked: ResponseAsked) -> dict[str, Any]:
        """The chat the response asks: the instructions as the system message, then the conversation."""
        instructions = asked.instructions if asked.instructions is not None else self.instructions
        messages = [{"role": "system", "content": instructions}] if instructions else []
        messages += chat_messages(self.items)
        tools = checked_tools(asked.tools, "response.tools", self.bounds.max_tools) if asked.tools is not None \
            else self.tools
        choice = checked_choice(asked.tool_choice if asked.tool_choice is not None else self.tool_choice, tools,
                                "response.tool_choice")
        limit = self._tokens(asked.max_output_tokens) if asked.max_output_tokens is not None else (
            self.max_output_tokens or self.bounds.max_output_tokens)
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True}, "max_tokens": limit,
                                **chat_tools(tools, choice)}
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
        """The user started speaking while a response runs (server VAD with `interrupt_response`): the response is
        cancelled (`turn_detected`) as `stop` cancels it, and its audio item, which holds only the audio that was
        sent, is told truncated there (`conversation.item.truncated`)."""
        turn = self.turn
        if turn is None or self.running is None or self.running.done():
            return
        turn.cancel_reason = "turn_detected"
        turn.interrupted_at_ms = audio_start_ms
        await self.stop()
        item = self.spoken.get(turn.item_id)
        if item is not None:
            await self.send(event("conversation.item.truncated", item_id=turn.item_id, content_index=0,
                                  audio_end_ms=round(item.audio_ms)))

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

