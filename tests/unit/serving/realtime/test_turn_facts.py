"""Each response of a realtime session is recorded once when it ends (its `TurnFacts` to the session's recorder, made
a `realtime.turn` event): the chat's trace and times, how it ended; and a chat that waits for a slot is told to the
client as `blazar.response.queued` before the answer. Against a fake chat port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from blazar.errors import RealtimeChatRefused
from blazar.events.types import encode
from blazar.serving.realtime.facts import TurnFacts, TurnModels, turn_event
from blazar.serving.realtime.port import ChatWatch, Usage
from blazar.serving.realtime.session import Bounds, RealtimeSession
from tests.support.bounds import HANG_S


class WatchedChat:
    """Tells the watch a trace id (and, with `queued`, a place in the queue), then answers `pieces`; with `hold`,
    waits on it after the first piece; with `refuse`, refuses."""

    def __init__(self, pieces: list[str | Usage], queued: tuple[int, int] | None = None,
                 hold: asyncio.Event | None = None, refuse: RealtimeChatRefused | None = None) -> None:
        self.pieces, self.queued, self.hold, self.refuse = pieces, queued, hold, refuse
        self.traces = iter(f"{i:032x}" for i in range(1, 100))

    async def chat(self, body: dict[str, Any], watch: ChatWatch | None = None) -> AsyncIterator[str | Usage]:
        assert watch is not None
        watch.chat_began(next(self.traces))
        if self.queued is not None:
            watch.chat_queued(*self.queued)
        if self.refuse is not None:
            raise self.refuse
        for i, piece in enumerate(self.pieces):
            yield piece
            if i == 0 and self.hold is not None:
                await self.hold.wait()


class Recorder:
    def __init__(self) -> None:
        self.turns: list[TurnFacts] = []

    def record(self, facts: TurnFacts) -> None:
        self.turns.append(facts)


def session(chat: WatchedChat, seen: list[dict[str, Any]], broken_at: str | None = None) -> RealtimeSession:
    async def send(e: dict[str, Any]) -> None:
        if e["type"] == broken_at:
            raise ConnectionResetError("the client is gone")
        seen.append(e)

    return RealtimeSession("gemma", chat, send, Bounds(8, 64), recorder=Recorder())


async def respond(s: RealtimeSession) -> None:
    await s.receive(orjson.dumps({"type": "response.create"}))
    assert s.running is not None
    await asyncio.wait({s.running}, timeout=HANG_S)


def recorded(s: RealtimeSession) -> list[TurnFacts]:
    assert isinstance(s.recorder, Recorder)
    return s.recorder.turns


async def test_a_completed_response_is_recorded_once_with_its_chat_trace_tokens_and_first_token() -> None:
    seen: list[dict[str, Any]] = []
    s = session(WatchedChat(["Hi", Usage(7, 2)]), seen)
    await respond(s)
    await respond(s)
    first, second = recorded(s)
    assert (first.index, second.index) == (0, 1) and first.trace_id != second.trace_id
    assert first.response_id == seen[0]["response"]["id"] and first.session_id == s.id
    assert first.status == "completed" and first.error is None and first.cancelled_at is None
    assert first.chat_trace_id == f"{1:032x}" and (first.tokens_in, first.tokens_out) == (7, 2)
    assert first.started_at <= first.first_token_at <= first.ended_at  # type: ignore[operator]
    ev = turn_event(first, TurnModels(asked="desk", llm="gemma"), "key:alice")
    encode(ev)  # within the log's bounds
    assert ev.chat is not None and ev.chat.trace_id == first.chat_trace_id and ev.chat.tokens_out == 2
    assert 0 <= ev.chat.first_ms <= ev.duration_ms  # type: ignore[operator]
    assert ev.vad is None and ev.transcription is None and ev.speech is None  # a text turn
    assert (ev.model, ev.llm, ev.tenant, ev.status) == ("desk", "gemma", "key:alice", "completed")


async def test_a_chat_waiting_for_a_slot_is_told_to_the_client_before_the_answer() -> None:
    seen: list[dict[str, Any]] = []
    s = session(WatchedChat(["Hi", Usage(3, 1)], queued=(2, 3)), seen)
    await respond(s)
    types = [e["type"] for e in seen]
    assert types[:3] == ["response.created", "blazar.response.queued", "response.output_item.added"]
    assert seen[1]["response_id"] == seen[0]["response"]["id"] and (seen[1]["position"], seen[1]["depth"]) == (2, 3)
    assert recorded(s)[0].queue_position == 2
    assert turn_event(recorded(s)[0], TurnModels("g", "g"), None).chat.queue_position == 2  # type: ignore[union-attr]


async def test_a_cancelled_and_a_refused_response_are_recorded_with_how_they_ended() -> None:
    seen: list[dict[str, Any]] = []
    hold = asyncio.Event()
    s = session(WatchedChat(["Hi", "more"], hold=hold), seen)
    await s.receive(orjson.dumps({"type": "response.create"}))
    async with asyncio.timeout(HANG_S):
        for _ in range(10_000):  # loop turns until the first delta is sent
            if any(e["type"] == "response.output_text.delta" for e in seen):
                break
            await asyncio.sleep(0)
    await s.receive(orjson.dumps({"type": "response.cancel"}))
    cancelled = recorded(s)[0]
    assert cancelled.status == "cancelled" and cancelled.cancelled_at is not None
    assert cancelled.tokens_out is None  # no usage came: the chat's own trace holds what it generated
    assert turn_event(cancelled, TurnModels("g", "g"), None).cancelled_ms is not None

    refused = session(WatchedChat([], refuse=RealtimeChatRefused("the queue is full", "queue_full")), [])
    await respond(refused)
    failed = recorded(refused)[0]
    assert (failed.status, failed.error, failed.chat_trace_id) == ("failed", "queue_full", f"{1:032x}")


async def test_a_turn_is_recorded_even_when_the_client_is_gone_before_its_end_is_sent() -> None:
    seen: list[dict[str, Any]] = []
    s = session(WatchedChat(["Hi", Usage(3, 1)]), seen, broken_at="response.done")
    await respond(s)
    assert s.running is not None and isinstance(s.running.exception(), ConnectionResetError)
    assert [t.status for t in recorded(s)] == ["completed"]
