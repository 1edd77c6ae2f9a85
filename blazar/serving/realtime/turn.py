"""One response of a realtime session: the chat asked through the session's `ChatPort`, streamed back as the
protocol's events (response.created, the assistant item added, its part, the deltas, then the dones and
`response.done` with usage). A text response sends the chat's text deltas; a spoken one (`voice`) cuts the text into
sentences as it arrives and speaks them (blazar/serving/realtime/voicing.py), sending the audio and its transcript;
the chat's function calls are items of their own (blazar/serving/realtime/calls.py). Cancelled (response.cancel, an
interruption, the connection gone), it ends with status `cancelled` and keeps what was sent so far; a refused chat or
speech ends `failed` after an `error` event. What the turn was (its sub-requests' traces, its timings) is gathered
in `facts` and recorded once it ends (the session's `TurnRecorder`). While its chat waits for a slot the client is
told `blazar.response.queued` (no OpenAI event says it; the SDK passes unknown types through)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from blazar.adapters.audio import speakable
from blazar.errors import RealtimeChatRefused, RealtimeSpeechRefused
from blazar.serving.realtime.calls import Calls
from blazar.serving.realtime.events import error, event, new_id
from blazar.serving.realtime.facts import TurnFacts
from blazar.serving.realtime.port import ToolCallDelta, Usage
from blazar.serving.realtime.sentences import SentenceSplitter
from blazar.serving.realtime.voicing import AudioItem, VoiceOut, Voicing

if TYPE_CHECKING:
    from blazar.serving.realtime.session import RealtimeSession

Sentences = asyncio.Queue[str | None]  # a spoken response's sentences, None after the last


class Turn:
    def __init__(self, session: RealtimeSession, response_id: str, out_of_band: bool,
                 voice: VoiceOut | None = None, started_at: float | None = None) -> None:
        self.session = session
        self.id = response_id
        self.facts = TurnFacts(session.id, response_id, session.turns)
        session.turns += 1
        if started_at is not None:  # a voice turn starts where the user's speech ended
            self.facts.started_at = started_at
        self._told: asyncio.Future[None] | None = None  # the queue notice, sent before anything after it
        self.out_of_band = out_of_band  # conversation "none": the answer is not added to the conversation
        self.item_id = new_id("item")
        self.text: list[str] = []
        self.usage: Usage | None = None
        self.ran = False  # its task took its first step (a task cancelled before that never runs its body)
        self.begun = False  # response.created was sent
        self.started = False  # its item and part were opened (the chat's first text came)
        self.cancel_reason = "client_cancelled"  # `turn_detected` when the user's speech interrupted it
        self.interrupted_at_ms: int | None = None  # where in the input audio the interrupting speech started
        self.calls = Calls(self)  # its function calls (blazar/serving/realtime/calls.py)
        self.text_opened = False
        self.text_index = 0  # the answer item's output index: after the calls opened before it
        speak = session.speak
        self.voicing = Voicing(speak, voice, self._emit) if voice is not None and speak is not None else None

    @property
    def modalities(self) -> list[str]:
        return ["audio"] if self.voicing is not None else ["text"]

    def _response(self, status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        r: dict[str, Any] = {"object": "realtime.response", "id": self.id, "status": status, "output": output,
                             "output_modalities": self.modalities,
                             "conversation_id": None if self.out_of_band else self.session.id, **extra}
        if self.usage is not None:
            u = self.usage
            r["usage"] = {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                          "total_tokens": u.input_tokens + u.output_tokens}
        return r

    def _said(self) -> str:
        """The answer as it stands: the text, or for a spoken one the transcript of what was sent."""
        return "".join(self.text) if self.voicing is None else self.voicing.transcript

    def _part(self, said: str) -> dict[str, Any]:
        return {"type": "text", "text": said} if self.voicing is None else {"type": "audio", "transcript": said}

    def _item(self, status: str) -> dict[str, Any]:
        said = self._said()
        content = ({"type": "output_text", "text": said} if self.voicing is None
                   else {"type": "output_audio", "transcript": said})
        return {"id": self.item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                "status": status, "content": [content]}

    def _at(self, **more: Any) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item_id, "output_index": self.text_index, **more}

    async def _emit(self, type_: str, **fields: Any) -> None:
        await self.session.send(event(type_, **self._at(content_index=0, **fields)))

    async def begin(self) -> None:
        self.begun = True
        await self.session.send(event("response.created", response=self._response("in_progress", [])))

    async def cancelled_unrun(self) -> None:
        if not self.begun:  # cancelled before its task's first step: it still begins, then ends
            await self.begin()
        await self._end("cancelled", "incomplete", {"type": "cancelled", "reason": self.cancel_reason})

    async def run(self, body: dict[str, Any]) -> None:
        self.ran = True
        try:
            if self.voicing is None:
                await self._chat(body, None)
            else:
                await self._spoken(body, self.voicing)
        except asyncio.CancelledError:
            self.facts.cancelled_at = time.perf_counter()
            await self._end("cancelled", "incomplete", {"type": "cancelled", "reason": self.cancel_reason})
            raise
        except (RealtimeChatRefused, RealtimeSpeechRefused) as e:
            self.facts.error = e.code
            await self.session.send(error(str(e), code=e.code, kind="server_error" if e.code == "engine_error" else
                                          "invalid_request_error"))
            await self._end("failed", "incomplete", {"type": "failed", "error": {"type": e.code, "code": e.code}})
            return
        if not self.started and not self.calls.made:  # nothing said: an empty answer item
            self.started = True
            await self._open()
        await self._end("completed", "completed", None)

    async def _chat(self, body: dict[str, Any], sentences: Sentences | None) -> None:
        """The chat's answer: sent as text deltas, or (`sentences`) cut into sentences for the voice; its function
        calls handed to `calls`."""
        splitter = SentenceSplitter()
        facts = self.facts
        try:
            async for piece in self.session.chat.chat(body, self):
                if self._told is not None:
                    await self._told
                    self._told = None
                if isinstance(piece, Usage):
                    self.usage = piece
                    facts.tokens_in, facts.tokens_out = piece.input_tokens, piece.output_tokens
                    continue
                if isinstance(piece, ToolCallDelta):
                    await self.calls.take(piece)
                    continue
                if not self.started:
                    self.started = True
                    facts.first_token_at = time.perf_counter()
                    await self._open()
                self.text.append(piece)
                if sentences is None:
                    await self._emit("response.output_text.delta", delta=piece)
                    continue
                for sentence in splitter.feed(piece):
                    sentences.put_nowait(sentence)
            for sentence in splitter.finish():
                if sentences is not None and speakable(sentence):
                    sentences.put_nowait(sentence)
        finally:
            if sentences is not None:
                sentences.put_nowait(None)

    async def _spoken(self, body: dict[str, Any], voicing: Voicing) -> None:
        """The chat read in its own task while its sentences are spoken as they end; a refusal of either ends both."""
        sentences: Sentences = asyncio.Queue()
        reader = asyncio.create_task(self._chat(body, sentences))
        try:
            await voicing.speak(_until_none(sentences))
            await reader  # the chat's refusal, when it failed
        finally:
            if not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            elif not reader.cancelled():
                reader.exception()  # NOTE: read, so a refusal raised by the voice first is not logged as lost
        text = "".join(self.text)
        await voicing.tail(text[len(voicing.transcript):])

    # -- the chat's watch (blazar/serving/realtime/port.py ChatWatch) ------------------------------------------------

    def chat_began(self, trace_id: str) -> None:
        self.facts.chat_trace_id = trace_id

    def chat_queued(self, position: int, depth: int) -> None:
        """The chat waits for a slot: the client is told (sent by a task of its own: this runs inside admission)."""
        self.facts.queue_position = position
        notice = event("blazar.response.queued", response_id=self.id, position=position, depth=depth)
        self._told = asyncio.ensure_future(self.session.send(notice))

    async def _open(self) -> None:
        send = self.session.send
        self.text_index = self.calls.made
        await send(event("response.output_item.added", response_id=self.id, output_index=self.text_index,
                         item=self._item("in_progress") | {"content": []}))
        if not self.out_of_band:
            await send(event("conversation.item.added", previous_item_id=self.calls.previous_item_id(),
                             item=self._item("in_progress") | {"content": []}))
        await self._emit("response.content_part.added", part=self._part(""))
        self.text_opened = True

    async def _end(self, status: str, item_status: str, details: dict[str, Any] | None) -> None:
        try:
            if self._told is not None:
                await self._told  # the queue notice goes first
            await self._say_end(status, item_status, details)
        finally:  # recorded even where the client is gone and nothing more can be sent
            self._record(status)

    async def _say_end(self, status: str, item_status: str, details: dict[str, Any] | None) -> None:
        send = self.session.send
        calls_first = self.text_index > 0  # the items close in their output order
        output: list[dict[str, Any]] = await self.calls.end(item_status) if calls_first else []
        if self.started:
            said = self._said()
            if self.voicing is None:
                await self._emit("response.output_text.done", text=said)
            else:
                await self._emit("response.output_audio.done")
                await self._emit("response.output_audio_transcript.done", transcript=said)
            await self._emit("response.content_part.done", part=self._part(said))
            item = self._item(item_status)
            await send(event("response.output_item.done", response_id=self.id, output_index=self.text_index,
                             item=item))
            if not self.out_of_band:
                previous = self.session.items[-1]["id"] if self.session.items else None
                self.session.items.append(item)
                if self.voicing is not None:
                    self.session.spoken[self.item_id] = AudioItem(self.voicing.said, self.voicing.audio_ms)
                await send(event("conversation.item.done", previous_item_id=previous, item=item))
            output.append(item)
        if not calls_first:
            output += await self.calls.end(item_status)
        extra = {"status_details": details} if details is not None else {}
        await send(event("response.done", response=self._response(status, output, **extra)))

    def _record(self, status: str) -> None:
        facts = self.facts
        facts.status = "completed" if status == "completed" else "failed" if status == "failed" else "cancelled"
        if facts.cancelled_at is None and status == "cancelled":
            facts.cancelled_at = time.perf_counter()
        v = self.voicing
        if v is not None:
            facts.speech_trace_id = v.speech_trace_id
            facts.first_audio_at = v.first_audio_at
            facts.audio_out_seconds = round(v.audio_out_s, 3) if v.samples else None
            if status == "cancelled":
                facts.audio_sent_ms = int(v.audio_ms)
        facts.ended_at = time.perf_counter()
        if self.session.recorder is not None:
            self.session.recorder.record(facts)


async def _until_none(sentences: Sentences) -> AsyncIterator[str]:
    while (sentence := await sentences.get()) is not None:
        yield sentence
