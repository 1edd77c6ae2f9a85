"""A request that waits for a slot: beside its `request.queued`, the route's `Hooks.on_queued` is told its position
and the queue's depth (a realtime session tells its client), once, before the slot comes; a request admitted at once
is not told."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from blazar.events.base import Event
from blazar.events.requests import RequestAdmitted, RequestQueued
from blazar.instances.live import Instance, LoadReport
from blazar.serving.admission import Admission, Ticket
from blazar.serving.admit import Admitter
from blazar.serving.call import Call
from blazar.serving.request import Hooks, Request
from tests.support.bounds import HANG_S


class Desk:
    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.events: list[Event] = []

    def emit(self, event: Event, trace_id: str, actor: str | None = None) -> None:
        self.events.append(event)

    def release_slot(self, ticket: Ticket, *, tokens: int | None = None, charged: int | None = None) -> None:
        self.admission.release(ticket)


def call(desk: Desk, told: list[tuple[int, int]]) -> Call:
    hooks = Hooks(on_queued=lambda position, depth: told.append((position, depth)))
    request = Request(model="m", engine_path="/v1/chat/completions", body={}, stream=True, trace_id="t" * 32,
                      hooks=hooks)
    return Call(request, cast(Any, desk))


async def test_a_queued_request_tells_its_hook_its_place_and_one_admitted_at_once_does_not() -> None:
    admission = Admission(queue_depth=4)
    # A remote engine's instance: admission only (no hold on a child, no slot placement).
    inst = Instance(instance_id="r1", model="m", port=0, slots=1, ctx_tokens=4096, engine_tag="remote",
                    url="http://engine.invalid")
    admitter = Admitter(cast(Any, None), cast(Any, None), admission, cast(Any, None), cast(Any, None))
    desk, first_told, second_told = Desk(admission), [], []
    first = call(desk, first_told)
    await admitter.seat(first, inst, LoadReport())
    assert first_told == []  # a free slot: nothing to tell
    second = call(desk, second_told)
    waiting = asyncio.ensure_future(admitter.seat(second, inst, LoadReport()))
    async with asyncio.timeout(HANG_S):
        for _ in range(1000):  # loop turns until it queues
            if second_told:
                break
            await asyncio.sleep(0)
    assert second_told == [(1, 1)] and not waiting.done()
    queued = [e for e in desk.events if isinstance(e, RequestQueued)]
    assert [(q.position, q.depth) for q in queued] == [(1, 1)]
    first.give_back_slot()
    await asyncio.wait_for(waiting, HANG_S)
    assert second_told == [(1, 1)] and sum(isinstance(e, RequestAdmitted) for e in desk.events) == 2
    second.give_back_slot()
