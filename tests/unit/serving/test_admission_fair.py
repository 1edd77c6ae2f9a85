"""Admission with fair share per key (blazar/serving/admission.py over blazar/serving/fair_queue.py): a key that floods
a model's slots does not put another key behind all of its requests; the position told is the fair order's; what
a request waited for others' share is on its ticket; the refusal, timeout and cancel paths stay whole; and
`fair_share=False` keeps the order by arrival."""

from __future__ import annotations

import asyncio

import pytest

from blazar.errors import QueueTimeout
from blazar.serving.admission import Admission, Ticket
from tests.support.admission import BOUND_S, Queued, enqueue, now


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def serve_all(adm: Admission, held: Ticket, waiters: list[Queued], *, charged: int = 20) -> list[Queued]:
    """Release the one slot over and over; the waiters in the order they were admitted."""
    order: list[Queued] = []
    ticket = held
    pending = {w.task: w for w in waiters}
    while pending:
        adm.release(ticket, tokens=charged // 2, charged=charged)
        done, _ = await asyncio.wait(pending, timeout=BOUND_S, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        task = done.pop()
        order.append(pending.pop(task))
        ticket = task.result()
    adm.release(ticket)
    return order


async def test_a_flooding_key_does_not_starve_a_light_one() -> None:
    adm = Admission(clock=Clock())
    held = await now(adm, "gemma", tenant="key:flood")
    flood = [await enqueue(adm, "gemma", tenant="key:flood") for _ in range(10)]
    light = await enqueue(adm, "gemma", tenant="key:light")
    assert [w.position for w in flood] == list(range(1, 11))
    assert (light.position, light.depth) == (1, 11)  # the flood's request in the slot was charged to it
    order = await serve_all(adm, held, [*flood, light])
    assert order[0] is light
    tickets = [w.task.result() for w in order]
    assert tickets[0].passed_by_share == 0
    assert all(t.passed_by_share == 1 for t in tickets[1:])  # the light key's one request went ahead of each


async def test_without_fair_share_the_light_key_waits_behind_the_whole_flood() -> None:
    adm = Admission(clock=Clock(), fair_share=False)
    held = await now(adm, "gemma", tenant="key:flood")
    flood = [await enqueue(adm, "gemma", tenant="key:flood") for _ in range(10)]
    light = await enqueue(adm, "gemma", tenant="key:light")
    assert light.position == 11
    order = await serve_all(adm, held, [*flood, light])
    assert order[-1] is light and all(w.task.result().passed_by_share == 0 for w in order)


async def test_weights_divide_the_slot_in_proportion() -> None:
    adm = Admission(clock=Clock())
    held = await now(adm, "gemma", tenant="key:gold", weight=3)
    gold = [await enqueue(adm, "gemma", tenant="key:gold", weight=3) for _ in range(20)]
    plain = [await enqueue(adm, "gemma", tenant="key:plain") for _ in range(20)]
    order = await serve_all(adm, held, [*gold, *plain])
    first = order[:20]
    assert 14 <= sum(1 for w in first if w in gold) <= 15  # 3 of 4 turns (the slot held at first was gold's)


async def test_a_cancelled_waiter_of_the_favoured_key_hands_its_turn_on() -> None:
    adm = Admission(clock=Clock())
    held = await now(adm, "gemma", tenant="key:flood")
    flood = [await enqueue(adm, "gemma", tenant="key:flood") for _ in range(3)]
    light = await enqueue(adm, "gemma", tenant="key:light")
    light.task.cancel()
    _, pending = await asyncio.wait([light.task], timeout=BOUND_S)
    assert not pending and adm.depth("gemma") == 3
    order = await serve_all(adm, held, flood)
    assert order == flood and all(w.task.result().passed_by_share == 0 for w in flood)


async def test_a_slot_handed_to_a_waiter_that_is_cancelled_goes_on_and_costs_its_key_nothing() -> None:
    adm = Admission(clock=Clock())
    held = await now(adm, "gemma", tenant="key:b")
    woken = await enqueue(adm, "gemma", tenant="key:a")
    b_next = await enqueue(adm, "gemma", tenant="key:b")
    a_next = await enqueue(adm, "gemma", tenant="key:a")
    adm.release(held, charged=20)  # to `woken`, charged an estimate
    woken.task.cancel()  # gone in the same instant: the slot passes on, the estimate is refunded
    _, pending = await asyncio.wait([woken.task], timeout=BOUND_S)
    assert not pending and woken.task.cancelled()
    async with asyncio.timeout(BOUND_S):
        ticket = await a_next.task  # a paid nothing for the slot it did not use, b was charged its 20: a goes first
    assert not b_next.task.done()
    adm.release(ticket, charged=20)
    adm.release(await b_next.admitted())
    assert adm.snapshot()["gemma"]["busy"] == 0


async def test_a_waiter_that_times_out_leaves_the_fair_queue() -> None:
    adm = Admission(wait_timeout_s=0.02, clock=Clock())
    held = await now(adm, "gemma", tenant="key:a")
    late = await enqueue(adm, "gemma", tenant="key:b")
    with pytest.raises(QueueTimeout) as caught:
        await late.admitted()
    assert caught.value.observations["position_when_queued"] == 1
    assert adm.depth("gemma") == 0
    adm.release(held)
    assert (await now(adm, "gemma", tenant="key:c")).position_when_queued == 0


async def test_a_deadline_request_still_goes_before_another_keys_share() -> None:
    adm = Admission(clock=Clock())
    held = await now(adm, "gemma", tenant="key:flood")
    light = await enqueue(adm, "gemma", tenant="key:light")
    seen: list[tuple[int, int]] = []
    urgent = asyncio.create_task(adm.acquire("gemma", 1, tenant="key:flood", deadline_s=60.0,
                                             on_queued=lambda p, d: seen.append((p, d))))
    await asyncio.sleep(0)
    assert seen == [(1, 2)]
    adm.release(held)
    async with asyncio.timeout(BOUND_S):
        ticket = await urgent
    assert not light.task.done()
    adm.release(ticket)
    adm.release(await light.admitted())
