"""/v1/realtime's turns in the log and its session bound, through the ASGI app with a fake gateway: each response's
`realtime.turn` names its chat's own trace (completed, or cancelled by a dropped connection), a chat that queues is
told as `blazar.response.queued`, and a session past `inputs.realtime_max_session_s` ends (`session_expired`,
1001)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from blazar.context import Blazar
from blazar.events.base import Recorded
from blazar.events.realtime import RealtimeTurn
from blazar.operations.config import set_value
from blazar.serving.request import Answer, Request
from tests.support.bounds import HANG_S
from tests.unit.api.test_realtime_socket import ChatGateway, closed_after, conductor, events_until


class QueuedGateway(ChatGateway):
    """Its chat waits for a slot first: the admission's hook is called as `admit.py` calls it."""

    async def serve(self, request: Request, watcher: object = None) -> Answer:
        assert request.hooks.on_queued is not None
        request.hooks.on_queued(1, 2)
        return await super().serve(request, watcher)


async def turns(app: Blazar) -> list[Recorded]:
    await app.request_writer().flush()
    return [r async for r in app.log.read(types=[RealtimeTurn.TYPE])]


async def test_a_response_is_one_realtime_turn_naming_its_chat_trace(app: Blazar) -> None:
    gateway = QueuedGateway()
    async with conductor(app, gateway) as c, c.simulate_ws("/v1/realtime", query_string="model=gemma",
                                                           host="localhost") as ws:
        session = orjson.loads(await ws.receive_text())["session"]
        await ws.send_text('{"type": "response.create"}')
        seen = await events_until(ws, "response.done")
    assert [e["type"] for e in seen][:2] == ["response.created", "blazar.response.queued"]
    assert (seen[1]["position"], seen[1]["depth"]) == (1, 2)
    [rec] = await turns(app)
    turn = rec.event
    assert isinstance(turn, RealtimeTurn) and rec.trace_id == turn.trace_id != gateway.asked[0].trace_id
    assert (turn.session_id, turn.response_id, turn.index) == (session["id"], seen[0]["response"]["id"], 0)
    assert turn.status == "completed" and turn.model == turn.llm == "gemma"
    assert turn.chat is not None and turn.chat.trace_id == gateway.asked[0].trace_id
    assert (turn.chat.queue_position, turn.chat.tokens_in, turn.chat.tokens_out) == (1, 5, 2)
    assert turn.chat.first_ms is not None and 0 <= turn.chat.first_ms <= turn.duration_ms


async def test_a_dropped_connection_records_its_running_turn_as_cancelled(app: Blazar) -> None:
    gateway = ChatGateway(hold=True)
    async with conductor(app, gateway) as c:
        async with c.simulate_ws("/v1/realtime", query_string="model=gemma", host="localhost") as ws:
            await ws.receive_text()
            await ws.send_text('{"type": "response.create"}')
            await events_until(ws, "response.output_text.delta")
        await asyncio.wait_for(gateway.closed.wait(), HANG_S)
    async with asyncio.timeout(HANG_S):
        for _ in range(100_000):  # the route's end records it once the chat is cancelled
            if found := await turns(app):
                break
            await asyncio.sleep(0.01)
    [rec] = found
    assert isinstance(rec.event, RealtimeTurn) and rec.event.status == "cancelled"
    assert rec.event.cancelled_ms is not None and rec.event.chat is not None


async def test_a_session_past_its_length_is_told_and_closed_with_1001_its_response_cancelled(app: Blazar) -> None:
    await set_value(app, "inputs.realtime_max_session_s", "1")  # the least: the test waits it once
    gateway = ChatGateway(hold=True)
    async with conductor(app, gateway) as c, c.simulate_ws("/v1/realtime", query_string="model=gemma",
                                                           host="localhost") as ws:
        await ws.receive_text()
        await ws.send_text('{"type": "response.create"}')
        async with asyncio.timeout(HANG_S):
            for _ in range(1_000_000):  # loop turns until the app closes (about a second)
                if ws.close_code is not None:
                    break
                await asyncio.sleep(0.01)
        sent, close = await closed_after(ws)
    types: list[Any] = [(e["type"], e.get("error", {}).get("code")) for e in sent]
    assert types[-2:] == [("response.done", None), ("error", "session_expired")] and close == 1001
    assert sent[-2]["response"]["status"] == "cancelled" and gateway.closed.is_set()
    assert [r.event.status for r in await turns(app)] == ["cancelled"]  # type: ignore[attr-defined]
