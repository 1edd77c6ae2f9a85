"""Per-model slot admission: admit under capacity, queue fairly, wake the right waiter, refuse with numbers."""

from __future__ import annotations

import asyncio
import time

import pytest

from blazar.serving.admission import (
    Admission,
    DeadlineUnmeetable,
    GlobalCap,
    QueueFull,
    QueueTimeout,
    Ticket,
    parse_priority,
)
from tests.support.admission import BOUND_S, Queued, enqueue, now, refused


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def drain(*tasks: asyncio.Task[Ticket]) -> None:
    """Wait for tasks to finish (here: to run their cancellation cleanup)."""
    _, pending = await asyncio.wait(tasks, timeout=BOUND_S)
    assert not pending


async def test_admitted_at_once_while_a_slot_is_free() -> None:
    adm = Admission()
    a = await now(adm, "qwen", 2)
    b = await now(adm, "qwen", 2)
    assert (a.position_when_queued, a.busy_after, a.slots, a.waited_s) == (0, 1, 2, 0.0)
    assert (b.position_when_queued, b.busy_after) == (0, 2)
    assert adm.snapshot()["qwen"]["busy"] == 2
    assert adm.depth("qwen") == 0


async def test_waiters_of_equal_priority_are_admitted_in_arrival_order() -> None:
    adm = Admission()
    held = await now(adm, "qwen")
    waiters = [await enqueue(adm, "qwen") for _ in range(3)]
    assert [(w.position, w.depth) for w in waiters] == [(1, 1), (2, 2), (3, 3)]
    order = []
    ticket = held
    for w in waiters:
        adm.release(ticket)
        ticket = await w.admitted()
        order.append(ticket.position_when_queued)
        assert all(not other.task.done() for other in waiters[len(order):])
    assert order == [1, 2, 3]
    assert ticket.busy_after == 1


async def test_higher_priority_is_served_first_and_queues_ahead() -> None:
    adm = Admission()
    held = await now(adm, "qwen")
    low = await enqueue(adm, "qwen", priority=-10)
    normal = await enqueue(adm, "qwen", priority=0)
    high = await enqueue(adm, "qwen", priority=10)
    normal2 = await enqueue(adm, "qwen", priority=0)
    assert (low.position, normal.position, high.position, normal2.position) == (1, 1, 1, 3)
    served = []
    ticket = held
    for _ in range(4):
        adm.release(ticket)
        done, _ = await asyncio.wait([w.task for w in (low, normal, high, normal2) if w.task not in served],
                                     timeout=BOUND_S, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        task = done.pop()
        served.append(task)
        ticket = task.result()
    assert served == [high.task, normal.task, normal2.task, low.task]


async def test_newcomer_never_jumps_a_waiter_of_equal_priority() -> None:
    # A global cap blocks the waiter while its model has a free slot; the newcomer must still queue behind it.
    adm = Admission(global_cap=1)
    other = await now(adm, "gemma")
    waiter = await enqueue(adm, "qwen", slots=2)
    late = await enqueue(adm, "qwen", slots=2)
    assert late.position == 2
    adm.release(other)
    assert (await waiter.admitted()).position_when_queued == 1
    assert not late.task.done()
    late.task.cancel()


async def test_release_wakes_the_same_models_waiter_not_another_models() -> None:
    adm = Admission()
    qwen = await now(adm, "qwen")
    await now(adm, "gemma")
    gemma_waiter = await enqueue(adm, "gemma")
    qwen_waiter = await enqueue(adm, "qwen")
    adm.release(qwen)
    assert (await qwen_waiter.admitted()).key == "qwen"
    assert not gemma_waiter.task.done()
    assert adm.depth("gemma") == 1
    snap = adm.snapshot()
    assert (snap["gemma"]["busy"], snap["qwen"]["busy"]) == (1, 1)
    gemma_waiter.task.cancel()


async def test_a_full_queue_refuses_with_429_and_retry_after_from_hold_times() -> None:
    clock = Clock()
    adm = Admission(queue_depth=2, clock=clock)
    first = await now(adm, "qwen", 2)
    clock.t += 10.0
    adm.release(first)  # one hold of 10 s: the average
    await now(adm, "qwen", 2)
    await now(adm, "qwen", 2)
    waiters = [await enqueue(adm, "qwen", 2) for _ in range(2)]
    with pytest.raises(QueueFull) as caught:
        await refused(adm.acquire("qwen", 2))
    err = caught.value
    assert (err.http_status, err.reason, err.code) == (429, "queue_full", "queue_full")
    assert err.retry_after_s == 15.0  # ceil(10 s * (2 queued + 1) / 2 slots)
    assert (err.observations["queued"], err.observations["busy"], err.observations["slots"]) == (2, 2, 2)
    assert adm.depth("qwen") == 2  # the refused request took no place
    for w in waiters:
        w.task.cancel()


async def test_retry_after_is_at_least_one_second_without_history() -> None:
    adm = Admission(queue_depth=0)
    await now(adm, "qwen")
    with pytest.raises(QueueFull) as caught:
        await refused(adm.acquire("qwen", 1))
    assert caught.value.retry_after_s == 1.0


async def test_waiting_past_the_timeout_raises_503_and_leaves_the_queue() -> None:
    adm = Admission(wait_timeout_s=0.02)
    held = await now(adm, "qwen")
    behind = await enqueue(adm, "qwen")
    with pytest.raises(QueueTimeout) as caught:
        await behind.admitted()
    err = caught.value
    assert (err.http_status, err.reason) == (503, "queue_timeout")
    assert err.observations["position_when_queued"] == 1
    assert err.retry_after_s is not None and err.retry_after_s >= 1
    assert adm.depth("qwen") == 0
    assert adm.snapshot()["qwen"]["busy"] == 1
    adm.release(held)
    assert adm.snapshot()["qwen"]["busy"] == 0


async def test_a_waiter_admitted_as_its_deadline_strikes_keeps_the_slot() -> None:
    adm = Admission(wait_timeout_s=0.01)
    held = await now(adm, "qwen")
    waiter = await enqueue(adm, "qwen")
    # Block the loop past the deadline, then grant before the loop runs the timeout: CPython runs this task's step
    # (queued first) before the due timer, so the grant and the timeout land in the same iteration.
    time.sleep(0.02)  # noqa: ASYNC251 - the point is to stall the loop
    await asyncio.sleep(0)
    adm.release(held)
    ticket = await waiter.admitted()
    assert ticket.busy_after == 1
    assert adm.snapshot()["qwen"]["busy"] == 1
    adm.release(ticket)
    assert adm.snapshot()["qwen"]["busy"] == 0


async def test_a_cancelled_waiter_gives_up_its_place() -> None:
    adm = Admission()
    held = await now(adm, "qwen")
    gone = await enqueue(adm, "qwen")
    stays = await enqueue(adm, "qwen")
    gone.task.cancel()
    await drain(gone.task)
    assert gone.task.cancelled()
    assert adm.depth("qwen") == 1
    adm.release(held)
    ticket = await stays.admitted()
    assert ticket.position_when_queued == 2
    assert adm.snapshot()["qwen"]["busy"] == 1


async def test_a_waiter_cancelled_as_it_is_woken_passes_the_slot_on() -> None:
    adm = Admission()
    held = await now(adm, "qwen")
    woken = await enqueue(adm, "qwen")
    nxt = await enqueue(adm, "qwen")
    adm.release(held)  # hands the slot to `woken`: its task has not run yet
    woken.task.cancel()  # the client disconnects in the same instant
    await drain(woken.task)
    assert woken.task.cancelled()
    ticket = await nxt.admitted()
    assert ticket.busy_after == 1
    assert adm.snapshot()["qwen"]["busy"] == 1
    assert adm.snapshot()["qwen"]["ewma_hold_s"] is not None  # only the real hold was averaged
    adm.release(ticket)
    assert adm.snapshot()["qwen"]["busy"] == 0


async def test_a_release_right_after_a_cancel_skips_the_cancelled_waiter() -> None:
    adm = Admission()
    held = await now(adm, "qwen")
    gone = await enqueue(adm, "qwen")
    stays = await enqueue(adm, "qwen")
    gone.task.cancel()
    adm.release(held)  # before the cancelled task has run its cleanup
    assert (await stays.admitted()).position_when_queued == 2
    await drain(gone.task)
    assert adm.snapshot()["qwen"]["busy"] == 1


async def test_a_cancelled_waiter_with_nobody_behind_leaks_no_slot() -> None:
    adm = Admission()
    held = await now(adm, "qwen")
    woken = await enqueue(adm, "qwen")
    adm.release(held)
    woken.task.cancel()
    await drain(woken.task)
    assert adm.snapshot()["qwen"]["busy"] == 0
    assert adm.snapshot()["_global"]["busy"] == 0


async def test_more_slots_admit_waiters_before_the_newcomer() -> None:
    adm = Admission()
    await now(adm, "qwen", 1)
    waiter = await enqueue(adm, "qwen", 1)
    late = await enqueue(adm, "qwen", 2)  # the instance now has 2 slots: the old waiter takes the new one
    assert (await waiter.admitted()).slots == 2
    assert late.position == 1
    snap = adm.snapshot()["qwen"]
    assert (snap["slots"], snap["busy"], snap["queued"]) == (2, 2, 1)
    late.task.cancel()


async def test_new_slots_go_in_rank_order_newcomer_included() -> None:
    adm = Admission()
    await now(adm, "qwen", 1)
    high = await enqueue(adm, "qwen", 1, priority=10)
    low = await enqueue(adm, "qwen", 1, priority=-10)
    ticket = await now(adm, "qwen", 3, priority=0)  # two new slots: the high waiter's, then the newcomer's
    assert (ticket.position_when_queued, ticket.busy_after) == (0, 3)
    assert (await high.admitted()).slots == 3
    assert not low.task.done()
    assert adm.depth("qwen") == 1
    low.task.cancel()


async def test_fewer_slots_hold_new_requests_until_busy_drops_below() -> None:
    adm = Admission()
    a = await now(adm, "qwen", 3)
    b = await now(adm, "qwen", 3)
    waiter = await enqueue(adm, "qwen", 1)  # shrunk to 1 slot with 2 busy
    adm.release(a)
    assert adm.depth("qwen") == 1  # 1 busy, 1 slot: still full
    adm.release(b)
    assert (await waiter.admitted()).busy_after == 1


async def test_the_global_cap_holds_every_model_and_wakes_across_models() -> None:
    adm = Admission(global_cap=2)
    q1 = await now(adm, "qwen", 4)
    await now(adm, "qwen", 4)
    gemma = await enqueue(adm, "gemma", 4)  # gemma has free slots: only the cap holds it
    adm.release(q1)
    ticket = await gemma.admitted()
    assert ticket.key == "gemma"
    assert adm.snapshot()["_global"] == {"cap": 2, "busy": 2, "queued": 0}


async def test_the_global_cap_serves_the_oldest_waiter_that_can_run() -> None:
    adm = Admission(global_cap=1)
    qwen = await now(adm, "qwen", 1)
    gemma = await enqueue(adm, "gemma", 1)  # held only by the cap, came first
    qwen_next = await enqueue(adm, "qwen", 1)
    adm.release(qwen)
    assert (await gemma.admitted()).key == "gemma"
    assert not qwen_next.task.done()
    qwen_next.task.cancel()


async def test_the_global_cap_refuses_when_its_own_queue_is_full() -> None:
    adm = Admission(global_cap=1, queue_depth=1)
    await now(adm, "qwen")
    gemma = await enqueue(adm, "gemma")
    with pytest.raises(GlobalCap) as caught:
        await refused(adm.acquire("llama", 1))
    err = caught.value
    assert (err.http_status, err.reason) == (429, "global_cap")
    assert err.retry_after_s is not None and err.retry_after_s >= 1
    assert err.observations["cap_queued"] == 1
    gemma.task.cancel()


async def test_double_release_is_a_no_op() -> None:
    adm = Admission()
    ticket = await now(adm, "qwen", 2)
    other = await now(adm, "qwen", 2)
    adm.release(ticket)
    adm.release(ticket)
    assert adm.snapshot()["qwen"]["busy"] == 1
    assert adm.snapshot()["_global"]["busy"] == 1
    adm.release(other)
    assert adm.snapshot()["qwen"]["busy"] == 0


async def test_a_ticket_from_another_admission_is_refused() -> None:
    ticket = await now(Admission(), "qwen")
    with pytest.raises(ValueError, match="not issued by this Admission"):
        Admission().release(ticket)


async def test_snapshot_reports_the_numbers() -> None:
    clock = Clock()
    adm = Admission(clock=clock)
    t = await now(adm, "qwen", 1)
    clock.t += 4.0
    adm.release(t)
    t = await now(adm, "qwen", 1)
    clock.t += 9.0
    adm.release(t)
    held = await now(adm, "qwen", 1)
    waiter = await enqueue(adm, "qwen", 1)
    clock.t += 2.5
    snap = adm.snapshot()
    assert snap["qwen"] == {"slots": 1, "busy": 1, "queued": 1, "oldest_wait_s": 2.5,
                            "ewma_hold_s": pytest.approx(4.0 + 0.2 * (9.0 - 4.0))}
    assert snap["_global"] == {"cap": 0, "busy": 1, "queued": 1}
    adm.release(held)
    ticket = await waiter.admitted()
    assert ticket.waited_s == 2.5


async def test_an_on_queued_callback_that_raises_leaves_no_waiter() -> None:
    adm = Admission()
    await now(adm, "qwen")

    def boom(position: int, depth: int) -> None:
        raise RuntimeError("recorder down")

    with pytest.raises(RuntimeError):
        await refused(adm.acquire("qwen", 1, on_queued=boom))
    assert adm.depth("qwen") == 0


@pytest.mark.parametrize(("value", "expected"), [
    (None, 0), ("", 0), ("high", 10), ("High ", 10), ("normal", 0), ("low", -10), ("7", 7), ("-100", -100),
    ("+100", 100), ("0", 0),
])
def test_parse_priority_accepts_names_and_bounded_integers(value: str | None, expected: int) -> None:
    assert parse_priority(value) == expected


@pytest.mark.parametrize("value", ["urgent", "101", "-101", "1_0", "1.5", "\uff11"])
def test_parse_priority_rejects_anything_else_naming_the_forms(value: str) -> None:
    with pytest.raises(ValueError, match="high, normal, low, or an integer from -100 to 100"):
        parse_priority(value)


async def test_retry_after_follows_the_drain_of_short_requests_after_long_ones() -> None:
    """The daemon served long streams (40 s holds for 1,500 tokens); a flood of 32-token requests then queues. The
    queue drains at the measured seconds per token times what these requests may generate, over the slots: not at
    the long streams' hold, which would say ten times too long."""
    clock = Clock()
    adm = Admission(queue_depth=4, clock=clock)
    for _ in range(2):
        t = await now(adm, "gemma", 2)
        clock.t += 40.0
        adm.release(t, tokens=1500)
    for _ in range(2):
        await now(adm, "gemma", 2)
    waiters = []
    for _ in range(4):
        task = asyncio.create_task(adm.acquire("gemma", 2, max_tokens=32))
        await asyncio.sleep(0)
        waiters.append(task)
    with pytest.raises(QueueFull) as caught:
        await refused(adm.acquire("gemma", 2, max_tokens=32))
    # 5 requests of at most 32 tokens at 40/1500 s per token over 2 slots: 2.13 s, rounded up.
    assert caught.value.retry_after_s == 3.0
    assert caught.value.observations["drain_s"] == pytest.approx(5 * 32 * 40 / 1500 / 2)
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


# -- slot ids ---------------------------------------------------------------------------------------------------------

async def test_every_ticket_holds_a_distinct_slot_id_and_a_release_frees_it() -> None:
    adm = Admission()
    tickets = [await now(adm, "gemma", 3) for _ in range(3)]
    assert sorted(t.slot_id for t in tickets) == [0, 1, 2]
    adm.release(tickets[1])
    again = await now(adm, "gemma", 3)
    assert again.slot_id == tickets[1].slot_id


async def test_a_picker_chooses_among_the_free_slots_only() -> None:
    adm = Admission()
    first = await adm.acquire("gemma", 4, pick=lambda free: max(free))
    offered: list[frozenset[int]] = []

    def pick(free: frozenset[int]) -> int:
        offered.append(free)
        return 2

    second = await adm.acquire("gemma", 4, pick=pick)
    assert (first.slot_id, second.slot_id) == (3, 2)
    assert offered == [frozenset({0, 1, 2})]
    with pytest.raises(ValueError, match="not one of the free slots"):
        await adm.acquire("gemma", 4, pick=lambda free: 3)


async def test_a_queued_waiter_gets_the_slot_its_picker_prefers_when_one_frees() -> None:
    adm = Admission()
    held = [await now(adm, "gemma", 2) for _ in range(2)]
    waiter = asyncio.create_task(adm.acquire("gemma", 2, pick=lambda free: max(free)))
    await asyncio.sleep(0)
    adm.release(held[0])  # slot 0 frees: the only choice
    assert (await asyncio.wait_for(waiter, BOUND_S)).slot_id == 0


async def test_try_acquire_takes_a_free_slot_but_never_queues_or_passes_a_waiter() -> None:
    adm = Admission()
    first = await now(adm, "gemma", 2)
    extra = adm.try_acquire("gemma", 2)
    assert extra is not None and extra.slot_id != first.slot_id
    assert adm.try_acquire("gemma", 2) is None  # both busy: no queueing
    waiter = await enqueue(adm, "gemma", 2)
    adm.release(extra)
    ticket = await waiter.admitted()
    adm.release(first)
    adm.release(ticket)
    blocker = await enqueue_after_full(adm)
    assert adm.try_acquire("gemma", 2) is None  # someone waits: the free-looking slot is theirs
    blocker.task.cancel()
    await drain(blocker.task)


async def enqueue_after_full(adm: Admission) -> Queued:
    """Fill both slots of "gemma", queue one waiter, then free one slot while the waiter has not run yet."""
    a, b = await now(adm, "gemma", 2), await now(adm, "gemma", 2)
    q = await enqueue(adm, "gemma", 2)
    adm.release(a)  # the waiter is granted the slot; until it runs, nothing is free for others
    del b
    return q


# -- deadlines (EDF) --------------------------------------------------------------------------------------------------

async def test_requests_with_a_deadline_are_served_earliest_deadline_first_ahead_of_others() -> None:
    adm = Admission()
    held = await now(adm, "gemma")
    plain_high = asyncio.create_task(adm.acquire("gemma", 1, priority=10))
    await asyncio.sleep(0)
    late = asyncio.create_task(adm.acquire("gemma", 1, deadline_s=60.0))
    await asyncio.sleep(0)
    soon = asyncio.create_task(adm.acquire("gemma", 1, deadline_s=5.0))
    await asyncio.sleep(0)
    order = []
    ticket = held
    for _ in range(3):
        adm.release(ticket)
        await asyncio.sleep(0)
        done = next(t for t in (plain_high, late, soon) if t.done() and t not in order)
        order.append(done)
        ticket = done.result()
    assert order == [soon, late, plain_high]


async def test_a_deadline_the_measured_drain_cannot_meet_is_refused_at_once() -> None:
    clock = Clock()
    adm = Admission(clock=clock)
    t = await now(adm, "gemma")
    clock.t += 2.0
    adm.release(t, tokens=100)  # 20 ms per token measured, 100 tokens a request
    held = await now(adm, "gemma")
    with pytest.raises(DeadlineUnmeetable) as caught:
        await refused(adm.acquire("gemma", 1, max_tokens=50, deadline_s=0.5))
    e = caught.value
    assert (e.http_status, e.code) == (503, "deadline_unmeetable")
    # A slot to come free (a typical 2 s hold) and its own 50 tokens (1 s): 3 s against 0.5 s.
    assert e.observations["estimate_ms"] == pytest.approx(3000.0)
    assert e.observations["deadline_ms"] == pytest.approx(500.0)
    assert adm.depth("gemma") == 0  # it took no place in the queue
    # A deadline it can meet queues.
    ok = asyncio.create_task(adm.acquire("gemma", 1, max_tokens=50, deadline_s=10.0))
    await asyncio.sleep(0)
    assert adm.depth("gemma") == 1
    adm.release(held)
    assert (await asyncio.wait_for(ok, BOUND_S)).slot_id == 0


async def test_a_free_slot_does_not_save_a_request_whose_own_generation_outlasts_its_deadline() -> None:
    clock = Clock()
    adm = Admission(clock=clock)
    t = await now(adm, "gemma")
    clock.t += 1.0
    adm.release(t, tokens=100)  # 10 ms per token, 100 tokens a request
    with pytest.raises(DeadlineUnmeetable):  # likely 100 tokens (what requests generate), 1 s
        await refused(adm.acquire("gemma", 1, max_tokens=500, deadline_s=0.5))
    ticket = await adm.acquire("gemma", 1, max_tokens=40, deadline_s=0.5)  # at most 0.4 s: it can
    assert ticket.slot_id == 0


async def test_without_measurements_a_deadline_is_not_refused_but_bounds_the_wait() -> None:
    adm = Admission(wait_timeout_s=60.0)
    held = await now(adm, "gemma")
    with pytest.raises(DeadlineUnmeetable) as caught:
        await asyncio.wait_for(adm.acquire("gemma", 1, deadline_s=0.05), BOUND_S)
    assert caught.value.observations["deadline_passed"] is True
    assert adm.depth("gemma") == 0
    adm.release(held)
