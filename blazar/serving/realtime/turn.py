"""One response of a realtime session: the chat asked through the session's `ChatPort`, streamed back as the
protocol's events (response.created, the assistant item added, its text part, text deltas, then the dones and
`response.done` with usage). Cancelled (response.cancel, the connection gone), it ends with status `cancelled` and
keeps the text said so far; a refused chat ends `failed` after an `error` event."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from blazar.errors import RealtimeChatRefused
from blazar.serving.realtime.events import error, event, new_id
from blazar.serving.realtime.port import Usage

if TYPE_CHECKING:
    from blazar.serving.realtime.session import RealtimeSession


class Turn:
    def __init__(self, session: RealtimeSession, response_id: str, out_of_band: bool) -> None:
        self.session = session
        self.id = response_id
        self.out_of_band = out_of_band  # conversation "none": the answer is not added to the conversation
        self.item_id = new_id("item")
        self.text: list[str] = []
        self.usage: Usage | None = None
        self.ran = False  # its task took its first step (a task cancelled before that never runs its body)
        self.begun = False  # response.created was sent

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
        return {"response_id": self.id, "item_id": self.item_id, "output_index": 0, **more}

    async def begin(self) -> None:
        self.begun = True
        await self.session.send(event("response.created", response=self._response("in_progress", [])))

    async def cancelled_unrun(self) -> None:
        if not self.begun:  # cancelled before its task's first step: it still begins, then ends
            await self.begin()
        await self._end("cancelled", "incomplete", {"type": "cancelled", "reason": "client_cancelled"}, False)

    async def run(self, body: dict[str, Any]) -> None:
        self.ran = True
        send = self.session.send
        started = False
        try:
            async for piece in self.session.chat.chat(body):
                if isinstance(piece, Usage):
                    self.usage = piece
                    continue
                if not started:
                    started = True
                    await self._open()
                self.text.append(piece)
                await send(event("response.output_text.delta", **self._at(content_index=0, delta=piece)))
        except asyncio.CancelledError:
            await self._end("cancelled", "incomplete", {"type": "cancelled", "reason": "client_cancelled"},
                            started)
            raise
        except RealtimeChatRefused as e:
            await send(error(str(e), code=e.code, kind="server_error" if e.code == "engine_error" else
                             "invalid_request_error"))
            await self._end("failed", "incomplete", {"type": "failed", "error": {"type": e.code, "code": e.code}},
                            started)
            return
        if not started:
            await self._open()
        await self._end("completed", "completed", None, True)

    async def _open(self) -> None:
        send = self.session.send
        await send(event("response.output_item.added", response_id=self.id, output_index=0,
                         item=self._item("in_progress") | {"content": []}))
        if not self.out_of_band:
            previous = self.session.items[-1]["id"] if self.session.items else None
            await send(event("conversation.item.added", previous_item_id=previous,
                             item=self._item("in_progress") | {"content": []}))
        await send(event("response.content_part.added", **self._at(content_index=0,
                                                                     part={"type": "text", "text": ""})))

    async def _end(self, status: str, item_status: str, details: dict[str, Any] | None, started: bool) -> None:
        send = self.session.send
        output: list[dict[str, Any]] = []
        if started:
            text = "".join(self.text)
            await send(event("response.output_text.done", **self._at(content_index=0, text=text)))
            await send(event("response.content_part.done", **self._at(content_index=0,
                                                                        part={"type": "text", "text": text})))
            item = self._item(item_status)
            await send(event("response.output_item.done", response_id=self.id, output_index=0, item=item))
            if not self.out_of_band:
                previous = self.session.items[-1]["id"] if self.session.items else None
                self.session.items.append(item)
                await send(event("conversation.item.done", previous_item_id=previous, item=item))
            output.append(item)
        extra = {"status_details": details} if details is not None else {}
        await send(event("response.done", response=self._response(status, output, **extra)))
