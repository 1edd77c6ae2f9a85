"""Properties of slot admission under random interleavings of acquire, release, cancel (also racing a wake-up),
changing slot counts and a fake clock: no admission past a model's slots or the global cap, busy always equals the
tickets held, no waiter is left waiting beside a free slot, nothing leaks once everything is released, and each
model serves by priority, then arrival."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blazar.errors import AdmissionRefused
from blazar.serving.admission import Admission, Ticket
from tests.support.bounds import HANG_S

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = ("qwen", "gemma", "llama")
BOUND_S = HANG_S


@dataclass(frozen=True)
class Acquire:
    key: str
    slots: int
    priority: int


@dataclass(frozen=True)
class Release:
    pick: int
    twice: bool


@dataclass(frozen=True)
class Cancel:
    pick: int


@dataclass(frozen=True)
class ReleaseThenCancel:
    """Release a slot and cancel a waiter before the loop runs: the cancelled one may be the one just woken."""

    pick: int
    victim: int


@dataclass(frozen=True)
class CancelThenRelease:
    """Cancel a waiter and release a slot before the cancelled task has run its cleanup."""

    victim: int
    pick: int


@dataclass(frozen=True)
class Advance:
    seconds: float


_kinds = {
    "acquire": st.builds(Acquire, key=st.sampled_from(KEYS), slots=st.sampled_from([1, 1, 2, 3]),
                         priority=st.sampled_from([-10, 0, 0, 10])),
    "release": st.builds(Release, pick=st.integers(0, 50), twice=st.booleans()),
    "cancel": st.builds(Cancel, pick=st.integers(0, 50)),
    "release_then_cancel": st.builds(ReleaseThenCancel, pick=st.integers(0, 50), victim=st.integers(0, 50)),
    "cancel_then_release": st.builds(CancelThenRelease, victim=st.integers(0, 50), pick=st.integers(0, 50)),
    "advance": st.builds(Advance, seconds=st.sampled_from([0.0, 0.5, 3.0, 60.0])),
}
# Acquires and releases drawn more often than the rest, so that queues form and drain in most examples.
_op = st.sampled_from(["acquire"] * 4 + ["release"] * 3 + ["cancel", "release_then_cancel", "cancel_then_release",
                                                           "advance"]).flatmap(_kinds.__getitem__)


@dataclass
class Request:
    n: int  # arrival order
    key: str
    priority: int
    task: asyncio.Task[Ticket] | None = None
    queued: bool = False  # on_queued was called
    ticket: Ticket | None = None
    gone: bool = False  # cancelled or refused: never to be admitted
    released: bool = False


@dataclass
class World:
    adm: Admission
    cap: int
    depth: int
    requests: list[Request] = field(default_factory=list)

    def waiting(self) -> list[Request]:
        return [r for r in self.requests if r.queued and r.ticket is None and not r.gone]

    def held(self) -> list[Request]:
        return [r for r in self.requests if r.ticket is not None and not r.released]

    def release(self, r: Request, *, twice: bool = False) -> None:
        assert r.ticket is not None
        self.adm.release(r.ticket)
        if twice:
            self.adm.release(r.ticket)
        r.released = True

    def cancel(self, r: Request) -> None:
        assert r.task is not None
        r.gone = True
        r.task.cancel()

    def admitted(self, r: Request, ticket: Ticket) -> None:
        """Called the moment a request's acquire returns: the fairness and capacity checks."""
        assert ticket.busy_after <= ticket.slots
        for x in self.waiting():
            if x is not r and x.key == r.key:
                ahead = x.priority > r.priority or (x.priority == r.priority and x.n < r.n)
                assert not ahead, f"#{r.n} (priority {r.priority}) admitted while #{x.n} ({x.priority}) waits"
        r.ticket = ticket


async def _request(world: World, r: Request, slots: int) -> Ticket | None:
    def on_queued(position: int, depth: int) -> None:
        r.queued = True

    try:
        ticket = await world.adm.acquire(r.key, slots, priority=r.priority, on_queued=on_queued)
    except AdmissionRefused:
        r.gone = True
        return None
    if ticket.position_when_queued == 0:
        # Admitted at once, maybe together with waiters ranked ahead (slots grew): those were admitted first, but
        # their tasks resume after this one. Let them record first, so the order is judged as it happened.
        await asyncio.sleep(0)
    world.admitted(r, ticket)
    return ticket


async def _settle(world: World) -> None:
    """Run the loop until every task has reached a resting point: waiting on its future, or done."""
    for _ in range(10):
        await asyncio.sleep(0)


def _check(world: World) -> None:
    for r in world.requests:
        failure = r.task.exception() if r.task is not None and r.task.done() and not r.task.cancelled() else None
        if failure is not None:
            raise failure  # an assertion failed inside a request
    snap = world.adm.snapshot()
    for key in KEYS:
        held = sum(1 for r in world.held() if r.key == key)
        busy = snap[key]["busy"] if key in snap else 0
        assert busy == held, f"{key}: busy {busy} but {held} tickets held"
        queued = snap[key]["queued"] if key in snap else 0
        assert queued == sum(1 for r in world.waiting() if r.key == key)
        assert queued <= world.depth
    assert snap["_global"]["busy"] == len(world.held())
    if world.cap:
        assert snap["_global"]["busy"] <= world.cap
    # No missed wake-up: whoever still waits does so because its model, or the global cap, has no free slot.
    cap_full = bool(world.cap) and snap["_global"]["busy"] >= world.cap
    for key in KEYS:
        if key in snap and snap[key]["queued"]:
            assert cap_full or snap[key]["busy"] >= snap[key]["slots"], f"{key} has a free slot and waiters"


def _pick(items: list[Request], i: int) -> Request | None:
    return items[i % len(items)] if items else None


async def _run(ops: list[object], cap: int, depth: int) -> None:
    clock_t = [0.0]
    world = World(Admission(queue_depth=depth, global_cap=cap, wait_timeout_s=10_000, clock=lambda: clock_t[0]),
                  cap, depth)
    async with asyncio.timeout(BOUND_S):
        for op in ops:
            if isinstance(op, Acquire):
                r = Request(n=len(world.requests), key=op.key, priority=op.priority)
                world.requests.append(r)
                r.task = asyncio.create_task(_request(world, r, op.slots))
            elif isinstance(op, Release) and (r := _pick(world.held(), op.pick)):
                world.release(r, twice=op.twice)  # twice: after the slot has passed to the next waiter
            elif isinstance(op, Cancel) and (r := _pick(world.waiting(), op.pick)):
                world.cancel(r)
            elif isinstance(op, ReleaseThenCancel):
                if r := _pick(world.held(), op.pick):
                    world.release(r)
                if v := _pick(world.waiting(), op.victim):
                    world.cancel(v)
            elif isinstance(op, CancelThenRelease):
                if v := _pick(world.waiting(), op.victim):
                    world.cancel(v)
                if r := _pick(world.held(), op.pick):
                    world.release(r)
            elif isinstance(op, Advance):
                clock_t[0] += op.seconds
            await _settle(world)
            _check(world)

        # Wind down: cancel every waiter, release every slot; nothing may be left over.
        for r in world.waiting():
            world.cancel(r)
        await _settle(world)
        for r in world.held():
            world.release(r)
        await _settle(world)
        _check(world)
        snap = world.adm.snapshot()
        assert all(v["busy"] == 0 and v["queued"] == 0 for v in snap.values() if "slots" in v)
        assert snap["_global"]["busy"] == 0
        tasks = [r.task for r in world.requests if r.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)


@PROPERTY
@given(ops=st.lists(_op, min_size=10, max_size=60), cap=st.sampled_from([0, 0, 1, 2, 4]),
       depth=st.sampled_from([1, 3, 64]))
def test_admission_never_oversubscribes_never_leaks_and_keeps_fifo(ops: list[object], cap: int, depth: int) -> None:
    asyncio.run(_run(ops, cap, depth))
