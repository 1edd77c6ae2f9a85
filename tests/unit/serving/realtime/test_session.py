"""A realtime session's protocol, driven event by event against a fake chat port: what the client sees, in order,
and what chat each response asks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from blazar.errors import RealtimeChatRefused
from blazar.serving.realtime.port import ChatWatch, Usage
from blazar.serving.realtime.session import Bounds, RealtimeSession
from tests.support.bounds import HANG_S


class FakeChat:
    """Answers each chat with `pieces`; with `hold`, waits on it after the first piece (a response to cancel)."""

    def __init__(self, pieces: list[str | Usage], hold: asyncio.Event | None = None,
                 refuse: RealtimeChatRefused | None = None) -> None:
        self.pieces = pieces
        self.hold = hold
        self.refuse = refuse
        self.bodies: list[dict[str, Any]] = []
        self.closed = 0

    async def chat(self, body: dict[str, Any], watch: ChatWatch | None = None) -> AsyncIterator[str | Usage]:
        self.bodies.append(body)
        if self.refuse is not None:
            raise self.refuse
        try:
            for i, piece in enumerate(self.pieces):
                yield piece
                if i == 0 and self.hold is not None:
                    await self.hold.wait()
        finally:
            self.closed += 1


class Client:
    def __init__(self, chat: FakeChat, max_items: int = 8) -> None:
        self.seen: list[dict[str, Any]] = []

        async def send(e: dict[str, Any]) -> None:
            self.seen.append(e)

        self.session = RealtimeSession("gemma", chat, send, Bounds(max_items, 64))

    async def say(self, **e: Any) -> list[dict[str, Any]]:
        before = len(self.seen)
        await self.session.receive(orjson.dumps(e))
        if self.session.running is not None:
            await asyncio.wait({self.session.running}, timeout=HANG_S)
        return self.seen[before:]

    def types(self, events: list[dict[str, Any]]) -> list[str]:
        return [e["type"] for e in events]


def user(text: str, **more: Any) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}], **more}


async def test_a_text_response_streams_deltas_then_done_with_usage_and_joins_the_conversation() -> None:
    chat = FakeChat(["Hel", "lo", Usage(7, 2)])
    c = Client(chat)
    await c.session.start()
    assert c.seen[0]["type"] == "session.created" and c.seen[0]["session"]["model"] == "gemma"
    await c.say(type="session.update", session={"type": "realtime", "instructions": "Be brief.",
                                                "output_modalities": ["text"], "temperature": 0.2})
    assert c.seen[-1]["type"] == "session.updated" and c.seen[-1]["session"]["instructions"] == "Be brief."
    added = await c.say(type="conversation.item.create", item=user("Hi"))
    assert c.types(added) == ["conversation.item.added", "conversation.item.done"]
    out = await c.say(type="response.create")
    assert c.types(out) == ["response.created", "response.output_item.added", "conversation.item.added",
                            "response.content_part.added", "response.output_text.delta",
                            "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                            "response.output_item.done", "conversation.item.done", "response.done"]
    deltas = "".join(e["delta"] for e in out if e["type"] == "response.output_text.delta")
    assert deltas == out[6]["text"] == "Hello"
    done = out[-1]["response"]
    assert done["status"] == "completed" and done["usage"] == {"input_tokens": 7, "output_tokens": 2,
                                                               "total_tokens": 9}
    assert done["output"][0]["content"][0]["text"] == "Hello"
    assert chat.bodies[0]["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert chat.bodies[0]["temperature"] == 0.2 and chat.bodies[0]["stream"] is True
    await c.say(type="conversation.item.create", item=user("Again"))
    await c.say(type="response.create", response={"max_output_tokens": 1000})
    assert [m["content"] for m in chat.bodies[1]["messages"]] == ["Be brief.", "Hi", "Hello", "Again"]
    assert chat.bodies[1]["max_tokens"] == 64  # capped by the bound


async def test_response_cancel_ends_the_response_cancelled_and_closes_the_chat() -> None:
    hold = asyncio.Event()
    chat = FakeChat(["Once", " upon", Usage(3, 2)], hold=hold)
    c = Client(chat)
    await c.say(type="conversation.item.create", item=user("Tell a story"))
    await c.session.receive(orjson.dumps({"type": "response.create"}))
    for _ in range(100):  # bounded: the first delta arrives after a few loop turns
        if any(e["type"] == "response.output_text.delta" for e in c.seen):
            break
        await asyncio.sleep(0)
    await c.say(type="response.cancel")
    done = c.seen[-1]
    assert done["type"] == "response.done" and done["response"]["status"] == "cancelled"
    assert done["response"]["output"][0]["content"][0]["text"] == "Once"
    assert chat.closed == 1  # the chat's stream was closed: its engine request with it
    later = await c.say(type="response.cancel")
    assert later[0]["error"]["code"] == "response_cancel_not_active"


async def test_a_second_response_while_one_runs_is_an_error_and_stop_cancels_it() -> None:
    hold = asyncio.Event()
    c = Client(FakeChat(["a", "b"], hold=hold))
    await c.session.receive(orjson.dumps({"type": "response.create"}))
    await c.session.receive(orjson.dumps({"type": "response.create", "event_id": "e2"}))
    assert c.seen[-1]["error"]["code"] == "conversation_already_has_active_response"
    assert c.seen[-1]["error"]["event_id"] == "e2"
    await c.session.stop()  # the connection gone
    assert c.seen[-1]["response"]["status"] == "cancelled"


async def test_a_refused_chat_is_an_error_then_a_failed_response() -> None:
    c = Client(FakeChat([], refuse=RealtimeChatRefused("the key's daily token limit is spent", "limit_exceeded")))
    out = await c.say(type="response.create")
    assert c.types(out) == ["response.created", "error", "response.done"]
    assert out[1]["error"]["code"] == "limit_exceeded" and out[2]["response"]["status"] == "failed"


@pytest.mark.parametrize(("sent", "code"), [
    (b"{not json", "invalid_json"),
    (b"[1]", "invalid_event"),
    (orjson.dumps({"type": "session.nonsense"}), "unknown_event"),
    (orjson.dumps({"type": "input_audio_buffer.append", "audio": ""}), "audio_not_supported"),
    (orjson.dumps({"type": "session.update", "session": {"output_modalities": ["audio"]}}), "audio_not_supported"),
    (orjson.dumps({"type": "session.update", "session": {"tools": [{"type": "mcp", "server_label": "x"}]}}),
     "hosted_tool_not_supported"),
    (orjson.dumps({"type": "session.update", "session": {"temperature": 9}}), "invalid_value"),
    (orjson.dumps({"type": "session.update", "session": "x"}), "invalid_value"),
    (orjson.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "robot"}}),
     "invalid_value"),
    (orjson.dumps({"type": "conversation.item.create", "item": {"type": "function_call_output", "output": "1",
                                                                "call_id": "call_none"}}), "invalid_value"),
    (orjson.dumps({"type": "conversation.item.delete", "item_id": "item_none"}), "item_not_found"),
    (orjson.dumps({"type": "response.create", "response": {"output_modalities": ["audio"]}}), "audio_not_supported"),
])
async def test_a_bad_event_is_an_error_event_with_its_code_and_the_session_goes_on(sent: bytes, code: str) -> None:
    chat = FakeChat(["ok", Usage(1, 1)])
    c = Client(chat)
    await c.session.receive(sent)
    assert c.seen[-1]["type"] == "error" and c.seen[-1]["error"]["code"] == code, c.seen[-1]
    out = await c.say(type="response.create")
    assert out[-1]["response"]["status"] == "completed" and not chat.bodies[0]["messages"]


async def test_the_conversation_is_bounded_and_items_can_be_deleted() -> None:
    c = Client(FakeChat(["x"]), max_items=2)
    await c.say(type="conversation.item.create", item=user("one", id="item_1"))
    dup = await c.say(type="conversation.item.create", item=user("again", id="item_1"))
    assert dup[0]["error"]["code"] == "item_exists"
    await c.say(type="conversation.item.create", item=user("two"))
    full = await c.say(type="conversation.item.create", item=user("three"))
    assert full[0]["error"]["code"] == "conversation_full"
    gone = await c.say(type="conversation.item.delete", item_id="item_1")
    assert gone[0] == {**gone[0], "type": "conversation.item.deleted", "item_id": "item_1"}
    assert [i["content"][0]["text"] for i in c.session.items] == ["two"]
