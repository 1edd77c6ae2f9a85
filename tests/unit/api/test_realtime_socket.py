"""/v1/realtime through the ASGI app with a fake gateway: the upgrade's doors (Host, Origin, the key: also as a browser
sends it, in a subprotocol), the chat's SSE read into text deltas and usage, the connection's bounds, and a dropped
connection cancelling the running response."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import falcon.testing
import orjson
import pytest

from blazar.api.app import create_app
from blazar.api.auth import protocol_key
from blazar.api.console_follow import event_json
from blazar.api.realtime import sse_pieces
from blazar.context import Blazar
from blazar.operations import keys
from blazar.operations.config import set_value
from blazar.queries.event_tail import tail
from blazar.serving.realtime.port import ToolCallDelta, Usage
from blazar.serving.request import Answer, Request
from tests.support.bounds import HANG_S
from tests.support.fakes import FakeSupervisor


def sse(*events: dict[str, Any]) -> list[bytes]:
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


CHUNKS = sse({"choices": [{"delta": {"role": "assistant"}}]}, {"choices": [{"delta": {"content": "Hi"}}]},
             {"choices": [{"delta": {"content": " there"}}]},
             {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})


class ChatGateway:
    """What the route asks of the gateway: the scope check, the supervisor's resolve, and `serve` (a streamed chat:
    CHUNKS, or held open until closed when `hold`)."""

    def __init__(self, hold: bool = False) -> None:
        self.supervisor = FakeSupervisor()
        self.hold = hold
        self.asked: list[Request] = []
        self.closed = asyncio.Event()

    def check_scope(self, principal: object, model: str) -> None:
        return None

    async def serve(self, request: Request, watcher: object = None) -> Answer:
        self.asked.append(request)
        return Answer(status=200, stream=self._stream())

    async def _stream(self) -> AsyncIterator[bytes]:
        try:
            yield CHUNKS[1]
            if self.hold:
                await asyncio.Event().wait()
            for c in CHUNKS[2:]:
                yield c
        finally:
            self.closed.set()


def conductor(app: Blazar, gateway: ChatGateway) -> falcon.testing.ASGIConductor:
    return falcon.testing.ASGIConductor(create_app(app, FakeSupervisor(), cast(Any, gateway)))


async def closed_after(ws: Any) -> tuple[list[dict[str, Any]], int | None]:
    """What the app sent before it closed the socket, and the close code. NOTE: falcon's test client raises on a
    receive once the app has closed, even with messages pending, so they are read from its queue (the SDK's client
    reads them: tests/integration/test_realtime_api.py)."""
    async with asyncio.timeout(HANG_S):
        for _ in range(100_000):  # loop turns: the app closes within a few
            if ws.close_code is not None:
                break
            await asyncio.sleep(0)
    return [orjson.loads(e["text"]) for e in ws._collected_server_events if "text" in e], ws.close_code


async def events_until(ws: Any, last: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(HANG_S):
        while len(seen) < 1000:
            seen.append(orjson.loads(await ws.receive_text()))
            if seen[-1]["type"] == last:
                return seen
    raise AssertionError(last)


async def test_sse_pieces_reads_deltas_and_usage_across_split_blocks() -> None:
    joined = b"".join(CHUNKS)

    async def split() -> AsyncIterator[bytes]:
        for i in range(0, len(joined), 7):  # events cut anywhere
            yield joined[i:i + 7]

    assert [p async for p in sse_pieces(split())] == ["Hi", " there", Usage(5, 2)]


async def test_a_response_runs_as_an_internal_chat_of_the_route(app: Blazar) -> None:
    gateway = ChatGateway()
    async with conductor(app, gateway) as c, c.simulate_ws("/v1/realtime", query_string="model=gemma",
                                                           host="localhost") as ws:
        assert orjson.loads(await ws.receive_text())["type"] == "session.created"
        await ws.send_text(orjson.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}}).decode())
        await events_until(ws, "conversation.item.done")
        await ws.send_text('{"type": "response.create"}')
        done = (await events_until(ws, "response.done"))[-1]["response"]
    assert done["status"] == "completed" and done["usage"]["total_tokens"] == 7
    assert done["output"][0]["content"][0]["text"] == "Hi there"
    r = gateway.asked[0]
    assert (r.path, r.engine_path, r.stream, r.dialect) == ("/v1/realtime", "/v1/chat/completions", True, "openai")
    assert r.body is not None and r.body["messages"] == [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize(("host", "headers", "code"), [
    ("evil.example", {}, "host_not_allowed"),
    ("localhost", {"Origin": "http://evil.example"}, "origin_not_allowed"),
])
async def test_an_upgrade_from_a_foreign_host_or_origin_is_refused_with_1008(
        app: Blazar, host: str, headers: dict[str, str], code: str) -> None:
    async with conductor(app, ChatGateway()) as c, c.simulate_ws("/v1/realtime", query_string="model=gemma",
                                                                 host=host, headers=headers) as ws:
        sent, close = await closed_after(ws)
    assert [(e["type"], e["error"]["code"]) for e in sent] == [("error", code)] and close == 1008


async def test_an_unknown_model_is_refused_with_1008(app: Blazar) -> None:
    async with conductor(app, ChatGateway()) as c, c.simulate_ws("/v1/realtime", query_string="model=missing",
                                                                 host="localhost") as ws:
        sent, close = await closed_after(ws)
    assert [e["error"]["code"] for e in sent] == ["model_not_found"] and close == 1008


async def test_a_binary_message_is_an_error_and_a_too_large_one_closes_with_1009(app: Blazar) -> None:
    async with conductor(app, ChatGateway()) as c, c.simulate_ws("/v1/realtime", query_string="model=gemma",
                                                                 host="localhost") as ws:
        await ws.receive_text()
        await ws.send_data(b"\x00\x01")
        assert orjson.loads(await ws.receive_text())["error"]["code"] == "invalid_event"
        limit = app.settings().inputs.realtime_max_message_kib << 10
        await ws.send_text('{"type": "session.update", "session": {"instructions": "' + "a" * limit + '"}}')
        sent, close = await closed_after(ws)
    assert [e["error"]["code"] for e in sent] == ["message_too_large"] and close == 1009


async def test_a_dropped_connection_cancels_the_running_response_and_closes_its_chat(app: Blazar) -> None:
    gateway = ChatGateway(hold=True)
    async with conductor(app, gateway) as c:
        async with c.simulate_ws("/v1/realtime", query_string="model=gemma", host="localhost") as ws:
            await ws.receive_text()
            await ws.send_text('{"type": "response.create"}')
            await events_until(ws, "response.output_text.delta")
        await asyncio.wait_for(gateway.closed.wait(), HANG_S)  # the chat's stream closed: its engine request ends


@pytest.mark.parametrize(("path", "denied"), [("/v1/models", falcon.errors.WebSocketHandlerNotFound),
                                              ("/nowhere", falcon.errors.WebSocketPathNotFound)])
async def test_an_upgrade_to_any_other_path_is_denied_with_its_status(app: Blazar, path: str,
                                                                     denied: type[Exception]) -> None:
    """Not an error escaping the app: the error handlers close the socket with 3000 + the status (3405, 3404)."""
    async with conductor(app, ChatGateway()) as c:
        with pytest.raises(denied):
            async with c.simulate_ws(path, host="localhost"):
                pass


async def test_an_idle_session_is_told_and_closed_with_1001(app: Blazar) -> None:
    await set_value(app, "inputs.realtime_idle_s", "1")  # the least: the test waits it once, whatever the machine
    async with conductor(app, ChatGateway()) as c, c.simulate_ws("/v1/realtime", query_string="model=gemma",
                                                                 host="localhost") as ws:
        assert orjson.loads(await ws.receive_text())["type"] == "session.created"
        async with asyncio.timeout(HANG_S):
            for _ in range(1_000_000):  # loop turns until the app closes (about a second)
                if ws.close_code is not None:
                    break
                await asyncio.sleep(0.01)
        sent, close = await closed_after(ws)
    assert [e["error"]["code"] for e in sent] == ["idle_timeout"] and close == 1001


# -- part T (tools): the chat's tool-call deltas read as pieces; a forced tool choice goes as the engine's grammar


async def test_sse_pieces_reads_tool_call_deltas_as_call_pieces() -> None:
    chunks = sse({"choices": [{"delta": {"content": "Sure."}}]},
                 {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                                         "function": {"name": "f", "arguments": ""}}]}}]},
                 {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}}]},
                 {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}},
                                                        {"index": 1, "id": "call_b",
                                                         "function": {"name": "g", "arguments": "{}"}}]}}]},
                 {"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 4,
                                                                                       "completion_tokens": 6}})

    async def stream() -> AsyncIterator[bytes]:
        for c in chunks:
            yield c

    assert [p async for p in sse_pieces(stream())] == [
        "Sure.", ToolCallDelta(0, "call_a", "f", ""), ToolCallDelta(0, None, None, '{"x":'),
        ToolCallDelta(0, None, None, "1}"), ToolCallDelta(1, "call_b", "g", "{}"), Usage(4, 6)]


async def test_a_forced_tool_choice_is_asked_as_the_engines_grammar_and_the_client_body_kept(app: Blazar) -> None:
    gateway = ChatGateway()
    tool = {"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    async with conductor(app, gateway) as c, c.simulate_ws("/v1/realtime", query_string="model=gemma",
                                                           host="localhost") as ws:
        await ws.receive_text()
        await ws.send_text(orjson.dumps({"type": "session.update", "session": {
            "tools": [tool], "tool_choice": {"type": "function", "name": "get_weather"}}}).decode())
        updated = (await events_until(ws, "session.updated"))[-1]["session"]
        assert updated["tools"] == [tool] and updated["tool_choice"] == {"type": "function", "name": "get_weather"}
        await ws.send_text('{"type": "response.create"}')
        await events_until(ws, "response.done")
    r = gateway.asked[0]
    assert r.forced is not None and r.forced.names == ["get_weather"]
    assert r.body is not None and r.body["tool_choice"] == "none" and "grammar" in r.body
    assert r.parsed["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert orjson.loads(r.raw)["tools"][0]["function"]["name"] == "get_weather"


def test_the_key_subprotocol_is_read_from_what_a_browser_offers() -> None:
    assert protocol_key(["realtime", "openai-insecure-api-key.blz_abc", "openai-beta.realtime-v1"]) == "blz_abc"
    assert protocol_key(["realtime", "openai-insecure-api-key.", "openai-beta.realtime-v1"]) is None
    assert protocol_key(["realtime"]) is None and protocol_key([]) is None


async def test_a_browser_sends_its_key_as_a_subprotocol_and_is_answered_realtime(app: Blazar) -> None:
    _, secret = await keys.create(app, "alice")
    gateway = ChatGateway()
    async with conductor(app, gateway) as c, c.simulate_ws(
            "/v1/realtime", query_string="model=gemma", host="localhost", headers={"Origin": "http://localhost"},
            subprotocols=["realtime", f"openai-insecure-api-key.{secret}", "openai-beta.realtime-v1"]) as ws:
        assert orjson.loads(await ws.receive_text())["type"] == "session.created"
        assert ws.subprotocol == "realtime"  # never the key's
        await ws.send_text('{"type": "response.create"}')
        await events_until(ws, "response.done")
    principal = gateway.asked[0].principal
    assert principal is not None and principal.actor == "key:alice"  # the chat runs as the key's
    logged = [orjson.dumps(event_json(e)) for e in await tail(app.log, limit=500)]
    assert logged and not any(secret.encode() in data for data in logged)


@pytest.mark.parametrize("offered", [["realtime"], ["realtime", "openai-insecure-api-key.blz_not-a-real-key-at-all"]])
async def test_without_a_valid_key_subprotocol_the_upgrade_is_refused_with_1008(app: Blazar,
                                                                                offered: list[str]) -> None:
    await keys.create(app, "alice")
    async with conductor(app, ChatGateway()) as c, c.simulate_ws("/v1/realtime", query_string="model=gemma",
                                                                 host="localhost", subprotocols=offered) as ws:
        sent, close = await closed_after(ws)
    assert [e["error"]["code"] for e in sent] == ["invalid_api_key"] and close == 1008


async def test_a_client_that_offers_no_subprotocol_is_accepted_with_none(app: Blazar) -> None:
    async with conductor(app, ChatGateway()) as c, c.simulate_ws("/v1/realtime", query_string="model=gemma",
                                                                 host="localhost") as ws:
        assert orjson.loads(await ws.receive_text())["type"] == "session.created"
        assert ws.subprotocol is None


async def test_without_keys_a_page_offering_only_realtime_is_answered_realtime(app: Blazar) -> None:
    async with conductor(app, ChatGateway()) as c, c.simulate_ws("/v1/realtime", query_string="model=gemma",
                                                                 host="localhost", subprotocols=["realtime"]) as ws:
        assert orjson.loads(await ws.receive_text())["type"] == "session.created"
        assert ws.subprotocol == "realtime"
