"""One Realtime connection's session: its settings, its conversation, and the response running, driven by the
client's events one at a time (`RealtimeSession.receive`). The user is heard through the input audio buffer
(blazar/serving/realtime/hearing.py: server VAD, commit, transcription through the `HearPort`); a response is a chat
asked through the `ChatPort` (blazar/api/realtime.py: the gateway's own pipeline, as the caller) and streamed back as
the protocol's events, as text or spoken through the `SpeakPort` (blazar/api/realtime_voice.py); `response.cancel`,
an interruption or the connection ending cancels it, which cancels the engine requests under it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from blazar.errors import DialectError, RealtimeEventInvalid
from blazar.serving.realtime import items, truncation
from blazar.serving.realtime.events import HEAR_EVENTS, ItemAsked, ResponseAsked, SessionAsked, error, event, new_id
from blazar.serving.realtime.hearing import Hearing
from blazar.serving.realtime.input_audio import InputSettings, updated
from blazar.serving.realtime.output import OutputSettings
from blazar.serving.realtime.port import Absent, ChatPort, HearPort, Send, SpeakPort, TurnRecorder
from blazar.serving.realtime.tools import ToolChoice, chat_messages, chat_tools, checked_choice, checked_tools
from blazar.serving.realtime.turn import Turn
from blazar.serving.realtime.voicing import AudioItem, VoiceOut

M = TypeVar("M", bound=BaseModel)
NO_WHISPER = Absent("audio_not_supported", "this session has no whisper model to hear audio: blazar pull whisper-base")
Handler = Callable[[dict[str, Any], str | None], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Bounds:
    max_items: int
    max_output_tokens: int
    max_tools: int = 128
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
    tools: list[dict[str, Any]] = field(default_factory=list)  # as the session shows them (the Realtime shape)
    tool_choice: ToolChoice = "auto"
    turns: int = 0  # responses begun: the next turn's index
    recorder: TurnRecorder | None = None  # each turn's `realtime.turn` (None: not recorded)
    llm: str | None = None  # the chat model that answers (a profile's); None: `model` itself
    stt: str | None = None  # the whisper model that hears (shown in the session's audio.input.transcription)
    hear: HearPort | None = None  # None: the session does not hear (why: `hear_absent`)
    hear_absent: Absent = NO_WHISPER
    hearing: Hearing | None = field(init=False, default=None)
    speak: SpeakPort | None = None  # the session's voice; None: it has none (audio out is refused, `no_voice` says why)
    no_voice: str = "this session has no voice"
    no_voice_code: str = "audio_not_supported"  # model_not_allowed: the key's scope leaves the voice out
    output: OutputSettings = field(default_factory=OutputSettings)
    spoken: dict[str, AudioItem] = field(default_factory=dict)  # the assistant audio items' timelines, by item id

    def __post_init__(self) -> None:
        if self.hear is not None:
            self.hearing = Hearing(self, self.hear, self.stt or "", self.bounds.max_buffer_s)

    def view(self) -> dict[str, Any]:
        """The session as `session.created`/`session.updated` show it (a RealtimeSessionCreateRequest)."""
        heard = (self.hearing.view() if self.hearing is not None else
                 InputSettings(vad=None).view(self.stt or "") | {"transcription": None})
        v: dict[str, Any] = {
            "type": "realtime", "object": "realtime.session", "id": self.id, "model": self.model,
            "instructions": self.instructions, "output_modalities": self.output.resolved(self.speak),
            "max_output_tokens": self.max_output_tokens if self.max_output_tokens is not None else "inf",
            "tools": self.tools, "tool_choice": self.tool_choice, "audio": {"input": heard}}
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
        if kind in HEAR_EVENTS and self.hearing is None:
            await self.send(error(f"{kind}: {self.hear_absent.message}", code=self.hear_absent.code, event_id=eid))
        elif handler is None:
            await self.send(error(f"unknown event type {kind!r}", code="unknown_event", param="type",
                                  event_id=eid))
        else:
            try:
                await handler(data, eid)
            except RealtimeEventInvalid as e:
                await self.send(error(f"{kind}: {e}", code=type(e).code, param=e.param, event_id=eid))

    def _handlers(self) -> dict[str, Handler]:
        return {"session.update": self._update,
                "conversation.item.create": lambda d, e: items.create(self, _model(ItemAsked, d.get("item"), "item"),
                                                                      e),
                "conversation.item.delete": lambda d, e: items.delete(self, d, e),
                "response.create": self._respond, "response.cancel": self._cancel,
                "conversation.item.truncate": lambda d, e: truncation.truncate(self, d, e),
                "output_audio_buffer.clear": truncation.no_output_buffer(self),
                **(self._hearing_handlers() if self.hearing is not None else {})}

    def _hearing_handlers(self) -> dict[str, Handler]:
        h = self.hearing
        assert h is not None
        return {"input_audio_buffer.append": lambda data, eid: h.append(data.get("audio"), eid),
                "input_audio_buffer.commit": lambda data, eid: h.commit(eid),
                "input_audio_buffer.clear": lambda data, eid: h.clear()}

    async def _update(self, data: dict[str, Any], eid: str | None) -> None:
        asked = _model(SessionAsked, data.get("session"), "session")
        audio = asked.audio or {}
        output = self.output.with_asked(asked.output_modalities, audio.get("output"), self.speak, "session")
        if not await self._voiced(output.resolved(self.speak), "session.output_modalities", eid):
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
        tools = checked_tools(asked.tools, "session.tools", self.bounds.max_tools) if asked.tools is not None \
            else self.tools
        choice = checked_choice(asked.tool_choice if asked.tool_choice is not None else self.tool_choice, tools,
                                "session.tool_choice")
        if heard is not None and self.hearing is not None:
            self.hearing.configure(heard)
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

    async def _respond(self, data: dict[str, Any], eid: str | None) -> None:
        asked = _model(ResponseAsked, data.get("response") or {}, "response")
        output = self.output.with_asked(asked.output_modalities, (asked.audio or {}).get("output"), self.speak,
                                        "response")
        if not await self._voiced(output.resolved(self.speak), "response.output_modalities", eid):
            return
        if self.running is not None and not self.running.done():
            await self.send(error("a response is already in progress", code="conversation_already_has_active_"
                                  "response", event_id=eid))
            return
        self.chat_body(asked)  # NOTE: checked now (its tools), so a bad one is this event's error
        self._start(asked, output)

    async def respond_to_turn(self) -> None:
        """A turn heard with `create_response`: a response as `response.create` with the session's settings asks,
        unless one runs (a turn heard while it answers, with `interrupt_response` off). Its start is where VAD heard
        the user stop."""
        if self.running is None or self.running.done():
            started = self.hearing.stopped_at if self.hearing is not None else None
            self._start(ResponseAsked(), self.output, started)

    def _start(self, asked: ResponseAsked, output: OutputSettings, started_at: float | None = None) -> None:
        """The response as a task, set as the running one before anything awaits (a turn heard meanwhile sees it)."""
        voice: VoiceOut | None = None
        if "audio" in output.resolved(self.speak) and self.speak is not None:
            voice = output.voice_out(self.speak)
        turn = self.turn = Turn(self, new_id("resp"), asked.conversation == "none", voice, started_at)
        self.running = asyncio.create_task(self._answer(turn, asked, list(self.items)))

    async def _answer(self, turn: Turn, asked: ResponseAsked, conversation: list[dict[str, Any]]) -> None:
        await turn.begin()
        if self.hearing is not None:  # the transcripts of the audio items it reads
            await self.hearing.settled()
            self.hearing.told_to(turn.facts)
        await turn.run(self.chat_body(asked, conversation))

    def chat_body(self, asked: ResponseAsked, conversation: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The chat the response asks: the instructions as the system message, then the conversation (as it was
        when the response was asked; an audio item by its transcript, left out when it has none)."""
        instructions = asked.instructions if asked.instructions is not None else self.instructions
        messages = [{"role": "system", "content": instructions}] if instructions else []
        messages += chat_messages(self.items if conversation is None else conversation)
        tools = checked_tools(asked.tools, "response.tools", self.bounds.max_tools) if asked.tools is not None \
            else self.tools
        choice = checked_choice(asked.tool_choice if asked.tool_choice is not None else self.tool_choice, tools,
                                "response.tool_choice")
        limit = self._tokens(asked.max_output_tokens) if asked.max_output_tokens is not None else (
            self.max_output_tokens or self.bounds.max_output_tokens)
        body: dict[str, Any] = {"model": self.llm or self.model, "messages": messages, "stream": True,
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

    async def close(self) -> None:
        """The connection is gone: what runs is cancelled, the response and the transcriptions."""
        await self.stop()
        if self.hearing is not None:
            await self.hearing.close()

    async def stop(self) -> None:
        """Cancel the running response (its engine requests with it) and wait for it to end."""
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
