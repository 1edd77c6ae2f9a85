"""One response of a realtime session: the chat asked through the session's `ChatPort`, streamed back as the
protocol's events (response.created, the assistant item added, its part, the deltas, then the dones and
`response.done` with usage). A text response sends the chat's text deltas; a spoken one (`voice`) cuts the text into
sentences as it arrives and speaks them (blazar/serving/realtime/voicing.py), sending the audio and its transcript.
Cancelled (response.cancel, an interruption, the connection gone), it ends with status `cancelled` and keeps what
was sent so far; a refused chat or speech ends `failed` after an `error` event."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from blazar.adapters.audio import speakable
from blazar.errors import RealtimeChatRefused, RealtimeSpeechRefused
from blazar.serving.realtime.events import error, event, new_id
from blazar.serving.realtime.port import Usage
from blazar.serving.realtime.sentences import SentenceSplitter
from blazar.serving.realtime.voicing import AudioItem, VoiceOut, Voicing

if TYPE_CHECKING:
    from blazar.serving.realtime.session import RealtimeSession

Sentences = asyncio.Queue[str | None]  # a spoken response's sentences, None after the last


class Turn:
    def __init__(self, session: RealtimeSession, response_id: str, out_of_band: bool,
                 voice: VoiceOut | None = None) -> None:
        self.session = session
        self.id = response_id
        self.out_of_band = out_of_band  # conversation "none": the answer is not added to the conversation
        self.item_id = new_id("item")
        self.text: list[str] = []
        self.usage: Usage | None = None
        self.ran = False  # its task took its first step (a task cancelled before that never runs its body)
        self.started = False  # its item and part were opened (the chat's first text came)
        self.cancel_reason = "client_cancelled"  # `turn_detected` when the user's speech interrupted it
        self.interrupted_at_ms: int | None = None  # where in the input audio the interrupting speech started
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
        return {"response_id": self.id, "item_id": self.item_id, "output_index": 0, **more}

    async def _emit(self, type_: str, **fields: Any) -> None:
        await self.session.send(event(type_, **self._at(content_index=0, **fields)))

    async def begin(self) -> None:
        await self.session.send(event("response.created", response=self._response("in_progress", [])))

    async def cancelled_unrun(self) -> None:
        await self._end("cancelled", "incomplete", {"type": "cancelled", "reason": self.cancel_reason})

    async def run(self, body: dict[str, Any]) -> None:
        self.ran = True
        try:
            if self.voicing is None:
                await self._chat(body, None)
            else:
                await self._spoken(body, self.voicing)
        except asyncio.CancelledError:
            await self._end("cancelled", "incomplete", {"type": "cancelled", "reason": self.cancel_reason})
            raise
        except (RealtimeChatRefused, RealtimeSpeechRefused) as e:
            await self.session.send(error(str(e), code=e.code, kind="server_error" if e.code == "engine_error" else
                                          "invalid_request_error"))
            await self._end("failed", "incomplete", {"type": "failed", "error": {"type": e.code, "code": e.code}})
            return
        if not self.started:
            await self._open()
        await self._end("completed", "completed", None)

    async def _chat(self, body: dict[str, Any], sentences: Sentences | None) -> None:
        """The chat's answer: sent as text deltas, or (`sentences`) cut into sentences for the voice."""
        splitter = SentenceSplitter()
        try:
            async for piece in self.session.chat.chat(body):
                if isinstance(piece, Usage):
                    self.usage = piece
                    continue
                if not self.started:
                    self.started = True
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

    async def _open(self) -> None:
        send = self.session.send
        await send(event("response.output_item.added", response_id=self.id, output_index=0,
                         item=self._item("in_progress") | {"content": []}))
        if not self.out_of_band:
            previous = self.session.items[-1]["id"] if self.session.items else None
            await send(event("conversation.item.added", previous_item_id=previous,
                             item=self._item("in_progress") | {"content": []}))
        await self._emit("response.content_part.added", part=self._part(""))

    async def _end(self, status: str, item_status: str, details: dict[str, Any] | None) -> None:
        send = self.session.send
        output: list[dict[str, Any]] = []
        if self.started:
            said = self._said()
            if self.voicing is None:
                await self._emit("response.output_text.done", text=said)
            else:
                await self._emit("response.output_audio.done")
                await self._emit("response.output_audio_transcript.done", transcript=said)
            await self._emit("response.content_part.done", part=self._part(said))
            item = self._item(item_status)
            await send(event("response.output_item.done", response_id=self.id, output_index=0, item=item))
            if not self.out_of_band:
                previous = self.session.items[-1]["id"] if self.session.items else None
                self.session.items.append(item)
                if self.voicing is not None:
                    self.session.spoken[self.item_id] = AudioItem(self.voicing.said, self.voicing.audio_ms)
                await send(event("conversation.item.done", previous_item_id=previous, item=item))
            output.append(item)
        extra = {"status_details": details} if details is not None else {}
        await send(event("response.done", response=self._response(status, output, **extra)))


async def _until_none(sentences: Sentences) -> AsyncIterator[str]:
    while (sentence := await sentences.get()) is not None:
        yield sentence
