"""Per-model slot admission: the gate between a routed request and its llama-server's `-np` slots. In memory, no I/O;
the gateway records `request.queued` / `request.admitted` / `request.rejected` from what this returns or raises.

Each model has its own wait queue (blazar/serving/fair_queue.py). Requests with a deadline come first, earliest
deadline first (EDF); the others follow by priority, and within a priority by each tenant's fair share of the slots
(charged in tokens, weighted per key; `queue.fair_share = false`: by arrival). A freed slot wakes a waiter that can
use it and nobody loses their place to a wake-up meant for another model. Queues are bounded, the wait has a timeout,
and a refusal carries a Retry-After estimated from how long that model's requests hold a slot. A request whose
deadline the measured drain says cannot be met is refused at once rather than left to time out in the queue.

Every ticket names a slot (`slot_id`, 0 .. -np - 1) that no other ticket holds: the gateway routes a session's turns
to the slot that holds its prefix (llama-server's `id_slot`), so each waiter may say which free slot it prefers.

    AdmissionRefused (blazar/errors.py)   refused before any token: http_status, reason, retry_after_s, observations
    ├── QueueFull      429         the model's queue already holds `queue_depth` waiters
    ├── GlobalCap      429         the global cap is reached and the requests waiting only for it fill its queue
    ├── QueueTimeout   503         no slot within `wait_timeout_s`; the waiter has left the queue
    └── DeadlineUnmeetable 503     the wait and the generation, as measured, outlast the deadline (or it passed)
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blazar.errors import AdmissionRefused, DeadlineUnmeetable, GlobalCap, QueueFull, QueueTimeout
from blazar.instances.session_slots import SlotPicker
from blazar.serving.fair_queue import KEYLESS, Charge, FairQueue, Waiting

# Weight of the newest hold time in the per-model average: recent enough to follow a change of workload, smooth
# enough that one long stream does not swing Retry-After.
_EWMA_ALPHA = 0.2

_NAMED_PRIORITIES = {"high": 10, "normal": 0, "low": -10}
_PRIORITY_RANGE = 100
# A batch line's priority (blazar/serving/batches.py): below any a client may name, so every interactive waiter
# ranks ahead of it; and batch waiters take no place in the queue depth that refuses interactive requests.
BACKGROUND_PRIORITY = -1000
_INTEGER = re.compile(r"[+-]?[0-9]{1,3}")



def parse_priority(value: str | None) -> int:
    """The X-Blazar-Priority header: high / normal / low (10 / 0 / -10) or an integer in [-100, 100]; absent → 0."""
    if value is None or not value.strip():
        return 0
    text = value.strip().lower()
    if text in _NAMED_PRIORITIES:
        return _NAMED_PRIORITIES[text]
    # NOTE: a regex rather than int(): int() also takes "1_0", " 5 " and non-ASCII digits.
    if _INTEGER.fullmatch(text) and -_PRIORITY_RANGE <= int(text) <= _PRIORITY_RANGE:
        return int(text)
    raise ValueError(f"X-Blazar-Priority must be high, normal, low, or an integer from -{_PRIORITY_RANGE} to "
                     f"{_PRIORITY_RANGE}; got {value!r}")


@dataclass
class Ticket:
    """A slot held on `key`; hand it back with `Admission.release` (a second release is a no-op)."""

    key: str
    position_when_queued: int  # 0: admitted at once; else the place it queued at (1 = next)
    waited_s: float
    busy_after: int  # this model's busy slots, this one included
    slots: int  # the model's -np when this one was admitted
    max_tokens: int | None = None  # what the request may generate at most (None: unbounded)
    slot_id: int = 0  # the engine slot this ticket holds (no other ticket of the model holds it meanwhile)
    passed_by_share: int = 0  # other tenants' requests, queued after it, admitted before it by their share
    charge: Charge | None = field(default=None, repr=False, compare=False)  # what its tenant was charged
    _acquired_at: float = field(default=0.0, repr=False, compare=False)
    _owner: object = field(default=None, repr=False, compare=False)
    _released: bool = field(default=False, repr=False, compare=False)


@dataclass(eq=False, kw_only=True)
class _Waiter(Waiting):
    """A request waiting for a slot of `key` (its deadline on the admission clock)."""

    key: str
    queued_at: float
    future: asyncio.Future[Ticket]
    position: int = 0
    max_tokens: int | None = None
    pick: SlotPicker | None = None

    def done(self) -> bool:
        return self.future.done()


@dataclass
class HoldTimes:
    """What a slot's time goes on, as measured by the holds given back: the average hold, seconds held per generated
    token and tokens per request (the drain rate of a queue of requests of another length than the last ones is
    estimated from these)."""

    ewma_hold_s: float | None = None
    ewma_s_per_token: float | None = None
    ewma_tokens: float | None = None

    def learn(self, hold_s: float, tokens: int | None = None) -> None:
        """One hold given back, and what it generated when that is known."""
        self.ewma_hold_s = _ewma(self.ewma_hold_s, hold_s)
        if tokens is not None and tokens > 0:
            self.ewma_s_per_token = _ewma(self.ewma_s_per_token, hold_s / tokens)
            self.ewma_tokens = _ewma(self.ewma_tokens, float(tokens))

    def expected_hold_s(self, max_tokens: int | None) -> float | None:
        """How long a request asking for at most `max_tokens` will likely hold its slot, from what holds and
        generated tokens have measured; None before anything was measured."""
        if self.ewma_s_per_token is not None and self.ewma_tokens is not None:
            tokens = self.ewma_tokens if max_tokens is None else min(float(max_tokens), self.ewma_tokens)
            return self.ewma_s_per_token * max(1.0, tokens)
        return self.ewma_hold_s


@dataclass
class _Lane:
    """One model: its latest -np, slots in use, waiters (in the order served), and how long its slots are held. While
    its instance is reshaped (adaptive slots) it is `held`: it has no slot to give, and every newcomer waits."""

    np: int
    queue: FairQueue[_Waiter]
    busy: int = 0
    held: bool = False
    taken: set[int] = field(default_factory=set)  # slot ids held by tickets
    times: HoldTimes = field(default_factory=HoldTimes)

    @property
    def slots(self) -> int:
        return 0 if self.held else self.np

    def reshaped(self, slots: int | None) -> _Lane:
        """Held (`slots` None: no slot is given, every newcomer queues), or opened at `slots`."""
        self.held, self.np = slots is None, slots or self.np
        return self

    def finish_s(self, ahead: list[_Waiter], max_tokens: int | None) -> float | None:
        """Seconds until a newcomer with `ahead` ranked before it would be done: its wait (the holds of those ahead,
        plus one hold for a slot to come free when none is, over the slots) and its own hold. None before anything
        was measured."""
        own = self.times.expected_hold_s(max_tokens)
        holds = [self.times.expected_hold_s(w.max_tokens) for w in ahead]
        if own is None or any(h is None for h in holds):
            return None
        wait = sum(h for h in holds if h is not None)
        if self.busy >= self.slots or ahead:
            typical = self.times.expected_hold_s(None)
            wait += typical if typical is not None else own
        return wait / max(1, self.slots) + own

    def drain_s(self, extra_max_tokens: int | None) -> float | None:
        """Seconds until the queue ahead, and one more request, has been served: the expected holds of every
        waiter and the newcomer, over the slots that serve them (slots x completions per second per slot)."""
        expected = self.times.expected_hold_s
        holds = [expected(w.max_tokens) for w in self.queue] + [expected(extra_max_tokens)]
        if any(h is None for h in holds):
            return None
        return sum(h for h in holds if h is not None) / max(1, self.slots)


def _ewma(old: float | None, sample: float) -> float:
    return sample if old is None else old + _EWMA_ALPHA * (sample - old)


def _retry_after(hold_s: float | None, ahead: int, servers: int) -> float:
    """Seconds until a slot is likely: average hold * (requests served first + 1) / slots serving them."""
    estimate = (hold_s or 0.0) * (ahead + 1) / max(1, servers)
    return float(max(1, math.ceil(estimate)))


def _lane_retry_after(lane: _Lane, max_tokens: int | None) -> float:
    """Retry-After for a request refused by `lane`: the measured drain of its queue, rounded up, at least 1."""
    drain = lane.drain_s(max_tokens)
    if drain is None:
        return _retry_after(lane.times.ewma_hold_s, len(lane.queue), lane.slots)
    return float(max(1, math.ceil(drain)))


def _check_deadline(lane: _Lane, waiter: _Waiter, observations: dict[str, Any]) -> None:
    """Refuse at once a request whose deadline the measured drain says it cannot meet: the holds of the waiters
    ranked before it, a slot to come free, and its own generation. Nothing measured yet: no refusal."""
    assert waiter.deadline is not None
    ahead = [w for w in lane.queue if not w.done() and w.rank < waiter.rank]
    finish = lane.finish_s(ahead, waiter.max_tokens)
    left = waiter.deadline - waiter.queued_at
    if finish is None or finish <= left:
        return
    times = lane.times
    raise DeadlineUnmeetable(
        f"{waiter.key}: the deadline is {left * 1000:.0f} ms away but this request would likely take "
        f"{finish * 1000:.0f} ms ({len(ahead)} ahead of it, {lane.busy} of {lane.slots} slots busy, "
        f"{times.ewma_s_per_token * 1000 if times.ewma_s_per_token else 0:.1f} ms per generated token measured)",
        observations=observations
        | {"deadline_ms": round(left * 1000, 3), "estimate_ms": round(finish * 1000, 3), "ahead": len(ahead),
           "ewma_s_per_token": times.ewma_s_per_token, "ewma_tokens": times.ewma_tokens})


class Admission:
    """Slot admission for every model. One instance per daemon; all calls come from its event loop.

    `wait_timeout_s` runs on the event loop's clock; `clock` times holds and waits for the numbers reported.
    """

    def __init__(self, *, queue_depth: int = 64, global_cap: int = 0, wait_timeout_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic, fair_share: bool = True) -> None:
        if queue_depth < 0 or global_cap < 0 or wait_timeout_s <= 0:
            raise ValueError("queue_depth and global_cap must be >= 0 and wait_timeout_s > 0")
        self._depth_limit = queue_depth
        self._cap = global_cap
        self._timeout_s = wait_timeout_s
        self._clock = clock
        self._fair = fair_share
        self._lanes: dict[str, _Lane] = {}
        self._busy = 0
        self._holds = HoldTimes()  # every model's holds: the Retry-After of the global cap
        self._seq = itertools.count()

    # -- acquire / release ---------------------------------------------------------------------------------------

    async def acquire(self, key: str, slots: int, *, priority: int = 0, max_tokens: int | None = None,
                      on_queued: Callable[[int, int], None] | None = None, deadline_s: float | None = None,
                      pick: SlotPicker | None = None, tenant: str = KEYLESS, weight: int = 1) -> Ticket:
        """A slot on `key`, whose instance has `slots` (-np) now. Queues when none is free; `on_queued(position,
        depth)` runs synchronously once if it does (the position in the order served, blazar/serving/fair_queue.py).
        `deadline_s` (seconds from now) puts the request in the EDF part of the queue and bounds its wait; `pick`
        chooses among the free slot ids; `tenant` (weighted `weight`) is whose share of the slots it is. Raises
        QueueFull, GlobalCap, QueueTimeout or DeadlineUnmeetable."""
        if slots < 1 or weight < 1:
            raise ValueError(f"slots and weight must be >= 1, got {slots} and {weight}")
        lane = self._lane(key, slots)
        now = self._clock()
        waiter = _Waiter(key=key, priority=priority, seq=next(self._seq), tenant=tenant, weight=weight, queued_at=now,
                         future=asyncio.get_running_loop().create_future(), max_tokens=max_tokens,
                         deadline=None if deadline_s is None else now + deadline_s, pick=pick)
        if waiter.deadline is not None:
            _check_deadline(lane, waiter, self._observations(key, lane, priority))
        if lane.queue.head() is None and self._has_room(lane):
            waiter.future.cancel()
            return self._admit(key, lane, position=0, queued_at=now, now=now, max_tokens=max_tokens, pick=pick,
                               charge=lane.queue.charge(tenant, weight))
        # Others wait, or there is no room: the newcomer takes its place, then whoever's turn it is runs. So a
        # newcomer never passes a waiter served before it, and slots that just grew go in the queue's order.
        lane.queue.add(waiter)
        self._pump(lane)
        if waiter.future.done():
            return waiter.future.result()  # its turn came at once: position_when_queued stays 0
        lane.queue.remove(waiter)
        try:
            self._check_depth(key, lane, priority, max_tokens)  # a refused request takes no place
        except AdmissionRefused:
            waiter.future.cancel()
            raise
        lane.queue.add(waiter)
        waiter.position = lane.queue.position(waiter)
        if on_queued is not None:
            try:
                on_queued(waiter.position, len(lane.queue))
            except BaseException:
                self._leave(waiter)
                raise
        return await self._wait(waiter)

    def try_acquire(self, key: str, slots: int, *, pick: SlotPicker | None = None,
                    slot_id: int | None = None) -> Ticket | None:
        """A slot on `key` now (`slot_id`: that one), or None: never queues, and never passes a waiter (best-of-N's
        extra candidates and session commands take only what nobody is waiting for)."""
        lane = self._lane(key, slots)
        if lane.queue.head() is not None or not self._has_room(lane):
            return None
        if slot_id is not None:
            if slot_id >= lane.slots or slot_id in lane.taken:
                return None
            pick = lambda free: slot_id  # noqa: E731
        now = self._clock()
        return self._admit(key, lane, position=0, queued_at=now, now=now, pick=pick)

    def give_back(self, ticket: Ticket) -> None:
        """Release a slot held for something other than a request (a session command): its hold time teaches the
        drain estimate nothing."""
        self._free(ticket, hold_observed=False)

    def release(self, ticket: Ticket, *, tokens: int | None = None, charged: int | None = None) -> None:
        """Free the ticket's slot and admit the next waiter that can use it; a second release is a no-op. `tokens`,
        what the request generated, teaches the drain estimate how a slot's time goes; `charged` (prompt +
        generated) is what its tenant's share is charged (None: the estimate charged at the grant stands)."""
        self._free(ticket, hold_observed=True, tokens=tokens, charged=charged)

    def reshaping(self, key: str, *, slots: int | None) -> None:
        """Adaptive slots: `key` held while its instance is relaunched (`slots` None), then opened at its new -np."""
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(np=slots or 1, queue=FairQueue(fair=self._fair))
        self._pump(lane.reshaped(slots))

    # -- what is true now ----------------------------------------------------------------------------------------

    def depth(self, key: str) -> int:
        lane = self._lanes.get(key)
        return len(lane.queue) if lane is not None else 0

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per model: slots, busy, queued, oldest_wait_s, ewma_hold_s; and "_global": cap (0 = none), busy, queued."""
        now = self._clock()
        out: dict[str, dict[str, Any]] = {}
        for key, lane in self._lanes.items():
            oldest = min((w.queued_at for w in lane.queue), default=None)
            out[key] = {"slots": lane.slots, "busy": lane.busy, "queued": len(lane.queue),
                        "oldest_wait_s": 0.0 if oldest is None else max(0.0, now - oldest),
                        "ewma_hold_s": lane.times.ewma_hold_s}
        out["_global"] = {"cap": self._cap, "busy": self._busy,
                          "queued": sum(len(lane.queue) for lane in self._lanes.values())}
        return out

    # -- internals -----------------------------------------------------------------------------------------------

    def _lane(self, key: str, slots: int) -> _Lane:
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(np=slots, queue=FairQueue(fair=self._fair))
        lane.np = slots  # the latest -np: adaptive slots may have changed it since the last call
        return lane

    def _has_room(self, lane: _Lane) -> bool:
        return lane.busy < lane.slots and (self._cap == 0 or self._busy < self._cap)

    def _admit(self, key: str, lane: _Lane, *, position: int, queued_at: float, now: float,
               max_tokens: int | None = None, pick: SlotPicker | None = None, charge: Charge | None = None,
               passed_by_share: int = 0) -> Ticket:
        # busy < slots and every taken id is distinct, so some id below `slots` is free (ids a larger instance's
        # tickets still hold are simply not offered).
        free = frozenset(range(lane.slots)) - lane.taken
        slot_id = min(free) if pick is None else pick(free)
        if slot_id not in free:
            raise ValueError(f"slot picker chose {slot_id}, not one of the free slots {sorted(free)}")
        lane.taken.add(slot_id)
        lane.busy += 1
        self._busy += 1
        return Ticket(key=key, position_when_queued=position, waited_s=max(0.0, now - queued_at),
                      busy_after=lane.busy, slots=lane.slots, max_tokens=max_tokens, slot_id=slot_id,
                      passed_by_share=passed_by_share, charge=charge, _acquired_at=now, _owner=self)

    def _pump(self, lane: _Lane) -> None:
        """Admit waiters while there is a slot for them. Without a global cap the models are independent, so only
        `lane` can have gained one. With a cap, each free global slot goes to the best-ranked head among the models
        that have a free slot of their own: the cap's queue is fair across models and never wakes one that cannot
        run."""
        if self._cap == 0:
            while lane.busy < lane.slots and (head := lane.queue.head()) is not None:
                self._grant(lane, head)
            return
        while self._busy < self._cap:
            best: tuple[_Lane, _Waiter] | None = None
            for candidate in self._lanes.values():
                if candidate.busy < candidate.slots and (head := candidate.queue.head()) is not None \
                        and (best is None or head.rank < best[1].rank):
                    best = (candidate, head)
            if best is None:
                return
            self._grant(*best)

    def _grant(self, lane: _Lane, waiter: _Waiter) -> None:
        charge = lane.queue.grant(waiter)
        waiter.future.set_result(self._admit(waiter.key, lane, position=waiter.position, queued_at=waiter.queued_at,
                                             now=self._clock(), max_tokens=waiter.max_tokens, pick=waiter.pick,
                                             charge=charge, passed_by_share=waiter.passed_by_share))

    async def _wait(self, waiter: _Waiter) -> Ticket:
        timeout_s = self._timeout_s
        if waiter.deadline is not None:
            timeout_s = min(timeout_s, max(0.0, waiter.deadline - self._clock()))
        try:
            async with asyncio.timeout(timeout_s):
                return await waiter.future
        except TimeoutError:
            granted = self._leave(waiter)
            if granted is not None:
                return granted  # admitted in the same instant the deadline struck: the slot is its to use
            lane = self._lanes[waiter.key]
            if timeout_s < self._timeout_s:
                raise DeadlineUnmeetable(
                    f"{waiter.key}: the deadline passed after {self._clock() - waiter.queued_at:.3g} s in the queue "
                    f"({lane.busy} of {lane.slots} busy, {len(lane.queue)} waiting)",
                    observations=self._observations(waiter.key, lane, waiter.priority)
                    | {"waited_s": max(0.0, self._clock() - waiter.queued_at), "deadline_passed": True}) from None
            raise QueueTimeout(
                f"{waiter.key}: no free slot within {self._timeout_s:g} s ({lane.busy} of {lane.slots} busy, "
                f"{len(lane.queue)} waiting)",
                retry_after_s=_lane_retry_after(lane, waiter.max_tokens),
                observations=self._observations(waiter.key, lane, waiter.priority)
                | {"waited_s": max(0.0, self._clock() - waiter.queued_at), "position_when_queued": waiter.position},
            ) from None
        except asyncio.CancelledError:
            # The client went away. If a release already handed this waiter its slot, pass the slot on.
            granted = self._leave(waiter)
            if granted is not None:
                self._free(granted, hold_observed=False)
            raise

    def _leave(self, waiter: _Waiter) -> Ticket | None:
        """Take a waiter out of its queue; the ticket if it had been admitted meanwhile, else None."""
        if waiter.future.done() and not waiter.future.cancelled():
            return waiter.future.result()
        if not waiter.future.done():
            waiter.future.cancel()
        self._lanes[waiter.key].queue.remove(waiter)
        return None

    def _free(self, ticket: Ticket, *, hold_observed: bool, tokens: int | None = None,
              charged: int | None = None) -> None:
        if ticket._owner is not self:
            raise ValueError(f"ticket for {ticket.key!r} was not issued by this Admission")
        if ticket._released:
            return
        ticket._released = True
        lane = self._lanes[ticket.key]
        lane.taken.discard(ticket.slot_id)
        lane.busy -= 1
        self._busy -= 1
        if ticket.charge is not None:  # a slot that served nothing costs its tenant nothing
            lane.queue.settle(ticket.charge, charged if hold_observed else 0)
        if hold_observed:  # a slot passed straight on by a cancelled waiter says nothing about hold times
            hold = max(0.0, self._clock() - ticket._acquired_at)
            lane.times.learn(hold, tokens)
            self._holds.learn(hold)
        self._pump(lane)

    def _check_depth(self, key: str, lane: _Lane, priority: int, max_tokens: int | None = None) -> None:
        observations = self._observations(key, lane, priority)
        queued = sum(1 for w in lane.queue if w.priority > BACKGROUND_PRIORITY)
        if queued >= self._depth_limit:
            raise QueueFull(
                f"{key}: {queued} requests already waiting for {lane.slots} slot(s) (queue depth {self._depth_limit})",
                retry_after_s=_lane_retry_after(lane, max_tokens),
                observations=observations | {"drain_s": lane.drain_s(max_tokens)})
        if self._cap and self._busy >= self._cap and lane.busy < lane.slots:
            blocked = self._cap_blocked()
            if blocked >= self._depth_limit:
                raise GlobalCap(
                    f"{key}: the global cap of {self._cap} in-flight requests is reached and {blocked} requests "
                    f"are already waiting for it",
                    retry_after_s=_retry_after(self._holds.ewma_hold_s, blocked, self._cap),
                    observations=observations | {"cap_queued": blocked})

    def _cap_blocked(self) -> int:
        """Waiters that a free global slot would admit: per model, no more than its own free slots."""
        return sum(min(len(lane.queue), max(0, lane.slots - lane.busy)) for lane in self._lanes.values())

    def _observations(self, key: str, lane: _Lane, priority: int) -> dict[str, Any]:
        return {"model": key, "slots": lane.slots, "busy": lane.busy, "queued": len(lane.queue),
                "queue_depth": self._depth_limit, "priority": priority, "ewma_hold_s": lane.times.ewma_hold_s,
                "global_cap": self._cap, "global_busy": self._busy}
