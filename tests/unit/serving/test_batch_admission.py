"""Batch lines yield to interactive requests at admission: a line queues at BACKGROUND_PRIORITY, below any priority a
client may name, so every interactive waiter is admitted first; and batch waiters take no place in the queue depth
that refuses interactive requests."""

from __future__ import annotations

import pytest

from blazar.serving.admission import BACKGROUND_PRIORITY, Admission, QueueFull, parse_priority
from tests.support.admission import enqueue, now, refused


async def test_an_interactive_request_is_admitted_ahead_of_batch_lines_queued_before_it() -> None:
    adm = Admission(queue_depth=8)
    running = await now(adm, "m")  # a batch line holds the one slot
    lines = [await enqueue(adm, "m", priority=BACKGROUND_PRIORITY) for _ in range(2)]
    lowest = await enqueue(adm, "m", priority=parse_priority("-100"))  # the lowest a client may ask for
    assert lowest.position == 1  # ahead of both lines, though they queued first
    adm.release(running)
    first = await lowest.admitted()
    assert not any(q.task.done() for q in lines)
    adm.release(first)
    second = await lines[0].admitted()  # then the lines, in their own order
    assert not lines[1].task.done()
    adm.release(second)
    adm.release(await lines[1].admitted())


async def test_batch_waiters_take_no_place_in_the_depth_that_refuses_interactive_requests() -> None:
    adm = Admission(queue_depth=1)
    running = await now(adm, "m")
    lines = [await enqueue(adm, "m", priority=BACKGROUND_PRIORITY) for _ in range(3)]  # never refused for depth
    interactive = await enqueue(adm, "m")  # the one place is still its
    with pytest.raises(QueueFull):
        await refused(adm.acquire("m", 1))  # the depth counts interactive waiters only
    adm.release(running)
    adm.release(await interactive.admitted())
    for q in lines:
        adm.release(await q.admitted())
    assert adm.snapshot()["m"]["queued"] == 0


def test_no_client_can_name_the_background_priority() -> None:
    with pytest.raises(ValueError):
        parse_priority(str(BACKGROUND_PRIORITY))
    assert parse_priority("low") > BACKGROUND_PRIORITY
