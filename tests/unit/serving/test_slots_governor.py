"""The adaptive slots governor's shell (blazar/serving/slots_governor.py) over a real Admission and a fake supervisor:
looks at the queue in; the reshape planned and recorded before anything is done, the lane held while the old shape
drains (no waiter refused, none admitted to the old shape), the relaunch, the waiters released into the new shape;
refusals recorded with their reason. And Admission.reshaping itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from blazar.context import Blazar
from blazar.errors import LoadFailed
from blazar.events.reshapes import InstanceReshaped, InstanceReshapePlanned, InstanceReshapeRefused
from blazar.instances.reshape import SlotsPlan
from blazar.instances.supervisor import Instance
from blazar.operations.config import set_value
from blazar.serving.admission import Admission, Ticket
from blazar.serving.ports import SupervisorPort
from blazar.serving.slots_governor import SlotsGovernor
from blazar.serving.slots_rule import SlotsRule
from tests.support.bounds import HANG_S

RULE = SlotsRule(max_slots=8, grow_after=2, shrink_after=2)


def _instance(iid: str = "i-1", slots: int = 1) -> Instance:
    return Instance(instance_id=iid, model="m", port=1, slots=slots, ctx_tokens=1024, engine_tag="t")


class _Reshaper:
    """Plans as told; a relaunch waits for `go`, then the supervisor has the new instance."""

    def __init__(self, sup: _Supervisor, fits: bool = True, fail: bool = False) -> None:
        self.sup, self.fits, self.fail = sup, fits, fail
        self.go = asyncio.Event()
        self.relaunched: list[tuple[str, int]] = []

    async def plan(self, instance_id: str, slots: int) -> SlotsPlan | None:
        return SlotsPlan(self.fits, 100 * slots, 100, 10_000, "" if self.fits else "needs 800 bytes, 500 free")

    async def relaunch(self, instance_id: str, slots: int, drain_s: float) -> Instance:
        self.relaunched.append((instance_id, slots))
        await self.go.wait()
        if self.fail:
            raise LoadFailed("the engine exited")
        self.sup.list = [_instance("i-2", slots)]
        return self.sup.list[0]


class _Supervisor:
    def __init__(self, instances: list[Instance]) -> None:
        self.list = instances
        self.reshaper = _Reshaper(self)

    def instances(self, model: str | None = None) -> list[Instance]:
        return self.list


async def _events(app: Blazar, kind: str) -> list[Any]:
    return [r.event async for r in app.log.read(types=[kind])]


async def _queued(admission: Admission, n: int) -> list[asyncio.Task[Ticket]]:
    before = admission.depth("m")
    tasks = [asyncio.create_task(admission.acquire("m", 1)) for _ in range(n)]
    for _ in range(100):  # bounded: each acquire queues at its first step
        if admission.depth("m") == before + n:
            break
        await asyncio.sleep(0)
    assert admission.depth("m") == before + n
    return tasks


async def _until(done: Callable[[], bool], what: str) -> None:
    """Polls `done` (bounded by HANG_S: a hang, never a measurement)."""
    for _ in range(int(HANG_S / 0.01)):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def _held(admission: Admission) -> None:
    await _until(lambda: admission.snapshot()["m"]["slots"] == 0, "the lane held")  # held: no slot to give


async def _settle(gov: SlotsGovernor) -> None:
    await _until(lambda: not gov.reshaping, "the reshape over")


async def test_sustained_queueing_grows_the_instance_holding_and_then_releasing_every_waiter(app: Blazar) -> None:
    sup = _Supervisor([_instance()])
    admission = Admission(queue_depth=16)
    gov = SlotsGovernor(app, cast(SupervisorPort, sup), admission)
    running = await admission.acquire("m", 1)
    waiters = await _queued(admission, 3)
    gov.tick(RULE)
    assert not gov.reshaping  # one look is not sustained
    gov.tick(RULE)
    assert "m" in gov.reshaping
    await _held(admission)
    [planned] = cast(list[InstanceReshapePlanned], await _events(app, "instance.reshape_planned"))
    assert (planned.direction, planned.from_slots, planned.to_slots) == ("grow", 1, 4)
    assert (planned.looks, planned.queued, planned.busy, planned.peak_demand) == (2, 3, 1, 4)
    assert (planned.planned_bytes, planned.had_bytes) == (400, 100)
    assert sup.reshaper.relaunched == []  # it waits for the request in flight: never cut
    admission.release(running)
    await _until(lambda: bool(sup.reshaper.relaunched), "the relaunch")
    assert admission.depth("m") == 3 and not any(w.done() for w in waiters)  # held, not admitted to the old shape
    late = await _queued(admission, 1)  # a newcomer queues too: nothing is refused
    sup.reshaper.go.set()
    await _settle(gov)
    tickets = [await w for w in waiters + late]
    assert sorted(t.slot_id for t in tickets) == [0, 1, 2, 3] and {t.slots for t in tickets} == {4}
    [done] = cast(list[InstanceReshaped], await _events(app, "instance.reshaped"))
    assert (done.instance_id, done.new_instance_id, done.to_slots, done.released) == ("i-1", "i-2", 4, 4)
    assert await _events(app, "instance.reshape_refused") == []


async def test_a_grow_that_does_not_fit_is_refused_recorded_once_and_nothing_is_held(app: Blazar) -> None:
    sup = _Supervisor([_instance()])
    sup.reshaper.fits = False
    admission = Admission(queue_depth=16)
    gov = SlotsGovernor(app, cast(SupervisorPort, sup), admission)
    running = await admission.acquire("m", 1)
    waiters = await _queued(admission, 2)
    for _ in range(6):
        gov.tick(RULE)
        await _settle(gov)
    [refused] = cast(list[InstanceReshapeRefused], await _events(app, "instance.reshape_refused"))
    assert (refused.reason, refused.to_slots, refused.detail) == ("does_not_fit", 3, "needs 800 bytes, 500 free")
    assert refused.observations["planned_bytes"] == 300
    assert await _events(app, "instance.reshape_planned") == [] and sup.reshaper.relaunched == []
    admission.release(running)  # the lane was never held: the next waiter runs on the old shape
    assert (await waiters[0]).slot_id == 0
    waiters[1].cancel()


async def test_a_failed_relaunch_is_recorded_and_reopens_the_lane(app: Blazar) -> None:
    sup = _Supervisor([_instance(slots=2)])
    sup.reshaper.fail = True
    sup.reshaper.go.set()
    admission = Admission(queue_depth=16)
    gov = SlotsGovernor(app, cast(SupervisorPort, sup), admission)
    held = [await admission.acquire("m", 2) for _ in range(2)]
    waiters = [asyncio.create_task(admission.acquire("m", 2)) for _ in range(2)]
    await asyncio.sleep(0)
    gov.tick(RULE)
    gov.tick(RULE)
    await _held(admission)
    for t in held:
        admission.release(t)
    await _settle(gov)
    [refused] = cast(list[InstanceReshapeRefused], await _events(app, "instance.reshape_refused"))
    assert (refused.reason, refused.detail) == ("failed", "the engine exited")
    assert len(await _events(app, "instance.reshape_planned")) == 1
    assert sorted([(await w).slot_id for w in waiters]) == [0, 1]  # the old shape's slots again


async def test_requests_that_do_not_end_within_the_drain_time_keep_the_old_shape(app: Blazar) -> None:
    await set_value(app, "fit.adaptive_drain_s", "0.1")
    sup = _Supervisor([_instance()])
    admission = Admission(queue_depth=16)
    gov = SlotsGovernor(app, cast(SupervisorPort, sup), admission)
    running = await admission.acquire("m", 1)
    waiter = (await _queued(admission, 1))[0]
    gov.tick(RULE)
    gov.tick(RULE)
    await _settle(gov)
    [refused] = cast(list[InstanceReshapeRefused], await _events(app, "instance.reshape_refused"))
    assert refused.reason == "busy" and sup.reshaper.relaunched == []
    admission.release(running)
    assert (await waiter).slot_id == 0


async def test_sustained_quiet_shrinks_a_grown_instance_back_to_its_first_shape(app: Blazar) -> None:
    sup = _Supervisor([_instance()])
    sup.reshaper.go.set()
    admission = Admission(queue_depth=16)
    gov = SlotsGovernor(app, cast(SupervisorPort, sup), admission)
    running = await admission.acquire("m", 1)
    waiters = await _queued(admission, 1)
    gov.tick(RULE)
    gov.tick(RULE)
    await _held(admission)
    admission.release(running)
    await _settle(gov)
    admission.release(await waiters[0])
    assert [i.slots for i in sup.list] == [2]
    for _ in range(2):  # quiet: nothing queued, no more busy than the first shape's one slot
        gov.tick(RULE)
    await _settle(gov)
    shapes = [(p.direction, p.from_slots, p.to_slots)
              for p in cast(list[InstanceReshapePlanned], await _events(app, "instance.reshape_planned"))]
    assert shapes == [("grow", 1, 2), ("shrink", 2, 1)]
    assert sup.reshaper.relaunched == [("i-1", 2), ("i-2", 1)]


async def test_a_held_lane_gives_no_slot_and_refuses_no_one_until_it_opens() -> None:
    admission = Admission(queue_depth=4)
    admission.reshaping("m", slots=None)
    assert admission.try_acquire("m", 2) is None
    waiter = asyncio.create_task(admission.acquire("m", 2))
    await asyncio.sleep(0)
    assert admission.depth("m") == 1 and not waiter.done()
    admission.reshaping("m", slots=3)
    ticket = await waiter
    assert (ticket.slots, ticket.slot_id, ticket.position_when_queued) == (3, 0, 1)
