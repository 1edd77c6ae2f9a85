"""One response of a realtime session: the chat asked through the session's `ChatPort`, streamed back as the
protocol's events (response.created, the assistant item added, its text part, text deltas, then the dones and
`response.done` with usage). Cancelled (response.cancel, the connection gone), it ends with status `cancelled` and
keeps the text said so far; a refused chat ends `failed` after an `error` event. What the turn was (its sub-requests'
traces, its timings) is gathered in `facts` and recorded once it ends (the session's `TurnRecorder`). While its chat
waits for a slot the client is told `blazar.response.queued` (no OpenAI event says it; the SDK passes unknown types
through)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from blazar.errors import RealtimeChatRefused
from blazar.serving.realtime.calls import Calls
from blazar.serving.realtime.events import error, event, new_id
from blazar.serving.realtime.facts import TurnFacts
from blazar.serving.realtime.port import ToolCallDelta, Usage

if TYPE_CHECKING:
    from blazar.serving.realtime.session import RealtimeSession


class Turn:
    def __init__(self, session: RealtimeSession, response_id: str, out_of_band: bool,
                 started_at: float | None = None) -> None:
        self.session = session
        self.id = response_id
        self.facts = TurnFacts(session.id, response_id, session.turns)
        session.turns += 1
        if started_at is not None:  # a voice turn starts where the user's speech ended
            self.facts.started_at = started_at
        self._told: asyncio.Task[None] | None = None  # the queue notice, sent before anything after it
        self.out_of_band = out_of_band  # conversation "none": the answer is not added to the conversation
        self.item_id = new_id("item")
        self.text: list[str] = []
        self.usage: Usage | None = None
        self.ran = False  # its task took its first step (a task cancelled before that never runs its body)
        self.calls = Calls(self)  # its function calls (blazar/serving/realtime/calls.py)
        self.text_opened = False
        self.text_index = 0  # the text item's output index: after the calls opened before it

    def _response(self, status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        r: dict[str, Any] = {"object": "realtime.response", "id": self.id, "status": status, "output": output,
                             "output_modalities": ["text"],
                             "conversation_id": None if self.out_of_band else self.session.id, **extra}
        if self.usage is not None:
            u = self.usage
            r["usage"] = {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                          "total_tokens": u.input_tokens + u.output_tokens}
        return r

    def _item(self, status: str) -> dict[str, Any]:
        return {"id": self.item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                "status": status, "content": [{"type": "output_text", "text": "".join(self.text)}]}

    def _at(self, **more: Any) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item_id, "output_index": self.text_index, **more}

    async def begin(self) -> None:
        await self.session.send(event("response.created", response=self._response("in_progress", [])))

    async def cancelled_unrun(self) -> None:
        await self._end("cancelled", "incomplete", {"type": "cancelled", "reason": "client_cancelled"}, False)

    async def run(self, body: dict[str, Any]) -> None:
        self.ran = True
        send = self.session.send
        started = False
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
                if not started:
                    started = True
                    facts.first_token_at = time.perf_counter()
                    await self._open()
                self.text.append(piece)
                await send(event("response.output_text.delta", **self._at(content_index=0, delta=piece)))
        except asyncio.CancelledError:
            facts.cancelled_at = time.perf_counter()
            await self._end("cancelled", "incomplete", {"type": "cancelled", "reason": "client_cancelled"},
                            started)
            raise
        except RealtimeChatRefused as e:
            facts.error = e.code
            await send(error(str(e), code=e.code, kind="server_error" if e.code == "engine_error" else
                             "invalid_request_error"))
            await self._end("failed", "incomplete", {"type": "failed", "error": {"type": e.code, "code": e.code}},
                            started)
            return
        if not started and not self.calls.made:  # nothing said: an empty text item
            started = True
            await self._open()
        await self._end("completed", "completed", None, started)

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
        await send(event("response.content_part.added", **self._at(content_index=0,
                                                                     part={"type": "text", "text": ""})))
        self.text_opened = True

    async def _end(self, status: str, item_status: str, details: dict[str, Any] | None, started: bool) -> None:
        try:
            if self._told is not None:
                await self._told  # the queue notice goes first
            await self._say_end(status, item_status, details, started)
        finally:  # recorded even where the client is gone and nothing more can be sent
            self._record(status)

    async def _say_end(self, status: str, item_status: str, details: dict[str, Any] | None, started: bool) -> None:
        send = self.session.send
        calls_first = self.text_index > 0  # the items close in their output order
        output: list[dict[str, Any]] = await self.calls.end(item_status) if calls_first else []
        if started:
            text = "".join(self.text)
            await send(event("response.output_text.done", **self._at(content_index=0, text=text)))
            await send(event("response.content_part.done", **self._at(content_index=0,
                                                                        part={"type": "text", "text": text})))
            item = self._item(item_status)
            await send(event("response.output_item.done", response_id=self.id, output_index=self.text_index,
                             item=item))
            if not self.out_of_band:
                previous = self.session.items[-1]["id"] if self.session.items else None
                self.session.items.append(item)
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
        facts.ended_at = time.perf_counter()
        if self.session.recorder is not None:
            self.session.recorder.record(facts)
