"""The swap-aware order's coordinator (blazar/serving/swaps.py) against a world with room for one model: a fake
supervisor whose `ensure` loads a model when nothing else is busy (evicting the idle one), and raises VictimsBusy
naming the busy one otherwise, the real Admission, and a fake clock. The order moves only on `nudge` and the clock,
so every step is the test's; what each request was told is read from the events on its trace."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from blazar.clock import FakeClock
from blazar.config_schema import Queue
from blazar.errors import Refused, SwapRecalled, VictimsBusy
from blazar.events.base import Event
from blazar.events.swaps import RequestServedAhead, RequestSwapHeld, RequestSwapReleased, RequestSwapWaited
from blazar.serving.admission import Admission
from blazar.serving.admit import _unless_recalled
from blazar.serving.swaps import SwapOrder


class RoomForOne:
    """The supervisor as the order sees it: one model loaded at a time, evicted only when idle."""

    def __init__(self, loaded: str) -> None:
        self.loaded: str | None = loaded
        self.busy: dict[str, int] = {}
        self.loads: list[str] = []

    def instances(self, model: str | None = None) -> list[str]:
        return [self.loaded] if self.loaded is not None and self.loaded == model else []

    def in_flight(self, model: str) -> int:
        return self.busy.get(model, 0)

    def ensure(self, model: str) -> Callable[[], Any]:
        async def go() -> str:
            if self.loaded == model:
                return model
            if self.loaded is not None and self.busy.get(self.loaded, 0):
                raise VictimsBusy(f"{model}: {self.loaded} is busy", victims=("i",), models=(self.loaded,))
            self.loaded = model
            self.loads.append(model)
            return model
        return go


class Trace:
    def __init__(self, trace_id: str) -> None:
        self.trace_id = trace_id
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def world(loaded: str, hold_s: float, timeout_s: float = 120.0) -> tuple[SwapOrder, RoomForOne, FakeClock]:
    clock = FakeClock()
    sup = RoomForOne(loaded)
    queue = Queue(swap_hold_s=hold_s, queue_timeout_s=timeout_s)
    order = SwapOrder(sup, Admission(clock=clock.monotonic), lambda: queue, clock.monotonic)  # type: ignore[arg-type]
    return order, sup, clock


def ask(order: SwapOrder, sup: RoomForOne, model: str, name: str) -> tuple[Trace, asyncio.Task[Any]]:
    trace = Trace(name)
    return trace, asyncio.create_task(order.instance(trace, model, sup.ensure(model)))


async def settle() -> None:
    """Let every ready task run until the loop is quiet (bounded: the order never spins without a nudge)."""
    for _ in range(50):
        await asyncio.sleep(0)


async def test_strict_order_a_swap_waits_for_the_busy_model_and_what_came_after_it_waits_behind() -> None:
    order, sup, clock = world("a", hold_s=0.0)
    sup.busy["a"] = 1  # a request runs on a
    tb, b = ask(order, sup, "b", "b1")
    await settle()
    assert not b.done()  # not refused: it waits for a to drain
    [held] = tb.of(RequestSwapHeld)
    assert (held.model, held.evicting, held.position, held.hold_s, held.in_flight) == ("b", ["a"], 0, 0.0, 1)
    ta, a2 = ask(order, sup, "a", "a2")  # came after the swap: strict order puts it behind
    await settle()
    assert not a2.done() and [e.swap_model for e in ta.of(RequestSwapWaited)] == ["b"]
    clock.advance(3.0)
    sup.busy["a"] = 0  # a's request ended
    order.nudge()
    await settle()
    assert b.done() and b.result() == ("b", None) and sup.loads[0] == "b"
    [released] = tb.of(RequestSwapReleased)
    assert released.reason == "expired" and released.held_ms == 0.0  # no hold: it ran out at its turn
    # a2 now needs a back, and b is idle: a is loaded in a2's own turn.
    assert a2.done() and a2.result() == ("a", None) and sup.loads == ["b", "a"]


async def test_in_the_hold_the_loaded_models_requests_are_served_ahead_and_then_recalled() -> None:
    order, sup, clock = world("a", hold_s=10.0)
    sup.busy["a"] = 1
    tb, b = ask(order, sup, "b", "b1")
    await settle()
    clock.advance(4.0)
    ta2, a2 = ask(order, sup, "a", "a2")
    await settle()
    inst, recall = a2.result()
    assert inst == "a" and recall is not None and not recall.is_set()
    [ahead] = ta2.of(RequestServedAhead)
    assert (ahead.swap_model, ahead.since_turn_ms, ahead.hold_s) == ("b", 4000.0, 10.0)
    assert not b.done()
    clock.advance(6.5)  # past the hold
    order.nudge()
    await settle()
    assert recall.is_set()  # a2, still without a slot, gives up its place
    [released] = tb.of(RequestSwapReleased)
    assert (released.reason, released.held_ms, released.served_ahead) == ("expired", 10000.0, 1)
    ta3, a3 = ask(order, sup, "a", "a3")  # after the hold: behind the swap
    await settle()
    assert not a3.done() and ta3.of(RequestSwapWaited) and not ta3.of(RequestServedAhead)
    sup.busy["a"] = 0
    order.nudge()
    await settle()
    assert b.result() == ("b", None) and a3.result() == ("a", None) and sup.loads == ["b", "a"]


async def test_a_swap_whose_models_drain_in_the_hold_goes_at_once() -> None:
    order, sup, clock = world("a", hold_s=10.0)
    sup.busy["a"] = 2
    tb, b = ask(order, sup, "b", "b1")
    tb2, b2 = ask(order, sup, "b", "b2")  # the same swap: joined
    await settle()
    clock.advance(2.0)
    sup.busy["a"] = 0
    order.nudge()
    await settle()
    assert b.result() == ("b", None) and b2.result() == ("b", None) and sup.loads == ["b"]
    for trace in (tb, tb2):
        [released] = trace.of(RequestSwapReleased)
        assert (released.reason, released.held_ms) == ("drained", 2000.0)
    assert order.waiting() == []


async def test_swaps_wait_in_the_order_they_came() -> None:
    order, sup, _ = world("a", hold_s=0.0)
    sup.busy["a"] = 1
    _, b = ask(order, sup, "b", "b1")
    await settle()
    tc, c = ask(order, sup, "c", "c1")
    await settle()
    assert [s.model for s in order.waiting()] == ["b", "c"]
    assert [h.position for h in tc.of(RequestSwapHeld)] == [1]
    sup.busy["a"] = 0
    order.nudge()
    await settle()
    # b went first; c's turn has come and b (idle in this world) gives way to it.
    assert b.done() and c.done() and sup.loads == ["b", "c"]
    assert [h.position for h in tc.of(RequestSwapHeld)] == [1]


async def test_a_swap_that_never_gets_room_is_refused_when_the_queue_timeout_passes() -> None:
    order, sup, clock = world("a", hold_s=0.0, timeout_s=5.0)
    sup.busy["a"] = 1
    _, b = ask(order, sup, "b", "b1")
    await settle()
    clock.advance(5.0)
    order.nudge()
    await settle()
    with pytest.raises(Refused) as refused:
        b.result()
    assert refused.value.reason == "queue_timeout" and refused.value.http_status == 503
    assert order.waiting() == []  # nobody waits on it any more: it is gone


async def test_a_request_that_goes_away_leaves_no_swap_behind() -> None:
    order, sup, _ = world("a", hold_s=0.0)
    sup.busy["a"] = 1
    _, b = ask(order, sup, "b", "b1")
    await settle()
    b.cancel()
    await settle()
    assert order.waiting() == []


async def test_a_recalled_waiter_gives_up_its_place_in_the_lane() -> None:
    admission = Admission()
    first = await admission.acquire("a", 1)
    recall = asyncio.Event()
    waiting = asyncio.create_task(_unless_recalled(admission.acquire("a", 1), recall, "a"))
    await settle()
    assert admission.depth("a") == 1
    recall.set()
    await settle()
    with pytest.raises(SwapRecalled):
        waiting.result()
    assert admission.depth("a") == 0
    admission.release(first)
    assert admission.snapshot()["a"]["busy"] == 0  # the slot went to nobody: the recalled waiter had left


async def test_a_slot_granted_before_the_recall_is_kept() -> None:
    admission = Admission()
    recall = asyncio.Event()
    ticket = await _unless_recalled(admission.acquire("a", 1), recall, "a")
    assert ticket.slot_id == 0
    recall.set()
    with pytest.raises(SwapRecalled):  # one that has not asked yet when the recall comes never queues
        await _unless_recalled(admission.acquire("a", 1), recall, "a")
    assert admission.depth("a") == 0


async def test_strict_order_serves_alternating_requests_in_turns_as_they_came() -> None:
    order, sup, _ = world("a", hold_s=0.0)
    sup.busy["a"] = 1  # a1 runs
    asked = [ask(order, sup, m, f"{m}{i}") for i, m in enumerate("babab", start=2)]
    await settle()
    assert [s.model for s in order.waiting()] == ["b", "a", "b", "a", "b"]  # one turn each, as they came
    for step, model in enumerate("babab"):
        sup.busy = {}  # whatever ran is done
        order.nudge()
        await settle()
        assert sup.loads[step] == model  # each turn a swap
        sup.busy[model] = 1  # its request runs
    assert all(task.done() for _, task in asked) and len(sup.loads) == 5


async def test_with_a_hold_alternating_requests_are_served_in_runs() -> None:
    order, sup, _ = world("a", hold_s=30.0)
    sup.busy["a"] = 1
    asked = [ask(order, sup, m, f"{m}{i}") for i, m in enumerate("babab", start=2)]
    await settle()
    assert [s.model for s in order.waiting()] == ["b"]  # the b's joined one turn; the a's went ahead of it
    ahead = [t for t, task in asked if task.done()]
    assert [t.trace_id for t in ahead] == ["a3", "a5"] and all(t.of(RequestServedAhead) for t in ahead)
    sup.busy = {}
    order.nudge()
    await settle()
    assert sup.loads == ["b"] and all(task.done() for _, task in asked)  # one swap for the whole burst
