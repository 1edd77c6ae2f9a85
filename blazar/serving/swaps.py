"""The swap-aware order: where a request's instance is asked for (blazar/serving/routing.py), a load that needs the
room of models busy now waits for them, in the order such swaps came, instead of being refused; and while the head
swap's hold runs, requests for the models it would evict are served ahead of it. The rule is blazar/serving/
swap_rule.py (pure); this coordinator observes (what is loaded, the requests running and waiting per model), asks
it, waits, and records each decision on the request's trace (blazar/events/swaps.py).

Every wait is bounded by `queue.queue_timeout_s` (then the usual 503 `queue_timeout`). A request served ahead takes
a recall with it: once the hold is over, one still waiting for its slot is recalled (the Admitter gives up its place,
the Router routes it again: behind the swap).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from blazar.config_schema import Queue
from blazar.errors import Refused, VictimsBusy
from blazar.events.base import Event
from blazar.events.swaps import (
    MAX_EVICTING,
    RequestServedAhead,
    RequestSwapHeld,
    RequestSwapReleased,
    RequestSwapWaited,
)
from blazar.instances.live import Instance
from blazar.serving.admission import Admission
from blazar.serving.ports import SupervisorPort
from blazar.serving.swap_rule import Swap, decide_entry, decide_head, hold_left_s

# The longest a waiter sleeps between looks when nothing wakes it (a queued request that timed out of a lane frees
# no hold and so wakes nobody): a backstop, not the way a swap normally moves on.
RECHECK_S = 1.0


class Traced(Protocol):
    """The request as the order sees it: its trace, to record decisions on."""

    @property
    def trace_id(self) -> str: ...
    def emit(self, event: Event) -> None: ...


@dataclass(eq=False)
class _Swap:
    """A waiting swap: what the rule sees, and what the coordinator keeps for it."""

    model: str
    evicting: frozenset[str]
    turn_at: float | None = None
    waiters: int = 0
    served_ahead: int = 0
    ended: Literal["drained", "expired"] | None = None
    ended_at: float = 0.0
    recalls: list[asyncio.Event] = field(default_factory=list)

    def view(self) -> Swap:
        return Swap(self.model, self.evicting, self.turn_at)


class SwapOrder:
    """The order of the swaps waiting now, and the requests that wait on them. One per gateway, on its event loop."""

    def __init__(self, supervisor: SupervisorPort, admission: Admission, settings: Callable[[], Queue],
                 clock: Callable[[], float]) -> None:
        self.supervisor = supervisor
        self.admission = admission
        self.settings = settings
        self.clock = clock
        self._swaps: list[_Swap] = []
        self._changed = asyncio.Event()

    def nudge(self) -> None:
        """Something the order waits on changed (a request ended, a swap came or went): every waiter looks again."""
        self._changed.set()
        self._changed = asyncio.Event()

    def waiting(self) -> list[Swap]:
        """The swaps waiting now, head first."""
        return [s.view() for s in self._swaps]

    async def instance(self, call: Traced, model: str,
                       ensure: Callable[[], Awaitable[Instance]]) -> tuple[Instance, asyncio.Event | None]:
        """`ensure()` (the model's instance, loading it on demand, VictimsBusy where only busy models have room) in
        its turn; with it the recall of a request served ahead of a swap (None otherwise)."""
        queue = self.settings()
        deadline = self.clock() + queue.queue_timeout_s
        seen: set[tuple[str, int]] = set()  # what was recorded on this trace already: (what, id of the swap)
        mine: _Swap | None = None
        try:
            while True:
                now, hold_s = self.clock(), self.settings().swap_hold_s
                # With no swap waiting every request goes on as ever: what is loaded is looked at only when one does.
                loaded = bool(self._swaps) and bool(self.supervisor.instances(model))
                entry = decide_entry(model, loaded, self.waiting(), now, hold_s)
                if entry == "go":
                    try:
                        inst = await ensure()
                    except VictimsBusy as busy:
                        self._enqueue(model, busy.models)
                        continue
                    if mine is not None:  # its swap went ahead on another waiter's load
                        self._record_release(call, mine, seen, hold_s)
                    return inst, None
                head = self._swaps[0] if self._swaps else None
                if entry == "ahead" and head is not None:
                    recall = asyncio.Event()
                    head.recalls.append(recall)
                    head.served_ahead += 1
                    call.emit(RequestServedAhead(
                        trace_id=call.trace_id, model=model, swap_model=head.model, hold_s=hold_s,
                        since_turn_ms=round((now - head.turn_at if head.turn_at is not None else 0.0) * 1000, 3)))
                    return await ensure(), recall
                if entry == "behind" and head is not None and _once(seen, "behind", head):
                    call.emit(RequestSwapWaited(trace_id=call.trace_id, model=model, swap_model=head.model))
                    self.nudge()  # one recalled from a lane just left it: the head's demand fell
                if entry == "own":
                    swap = self._own(model, mine)
                    mine = swap
                    self._record_held(call, swap, seen, hold_s)
                    if swap is self._swaps[0]:
                        done = await self._head_step(swap, now, hold_s, ensure)
                        if done is not None:
                            self._record_release(call, swap, seen, hold_s)
                            return done, None
                    self._record_release(call, swap, seen, hold_s)
                if self.clock() >= deadline:
                    raise self._timed_out(model, queue)
                await self._wait(deadline, hold_s)
        finally:
            if mine is not None:
                self._leave(mine)

    # -- the head --------------------------------------------------------------------------------------------------

    async def _head_step(self, swap: _Swap, now: float, hold_s: float,
                         ensure: Callable[[], Awaitable[Instance]]) -> Instance | None:
        """The head's step: its load tried once the models it evicts have drained (then the swap is over), or its hold
        run out (what was served ahead and has no slot yet recalled). None: it waits on."""
        step = decide_head(swap.view(), self._demand(swap.evicting), now, hold_s)
        if step == "expired":
            # It ran out at its end, whenever that is noticed: what the hold held is counted to there.
            self._end(swap, "expired", (now if swap.turn_at is None else swap.turn_at) + hold_s)
            for recall in swap.recalls:
                recall.set()
            swap.recalls.clear()
            return None
        if step == "hold":
            return None
        try:
            inst = await ensure()
        except VictimsBusy as busy:  # a request came in between: wait for it too
            swap.evicting = frozenset(busy.models)
            return None
        except BaseException:
            self._drop(swap)  # the load failed: the next swap's turn (this one's other waiters try again)
            raise
        self._end(swap, "drained", now)
        self._drop(swap)
        return inst

    def _end(self, swap: _Swap, reason: Literal["drained", "expired"], now: float) -> None:
        if swap.ended is None:
            swap.ended, swap.ended_at = reason, now

    def _demand(self, models: frozenset[str]) -> int:
        """The requests running on and waiting for `models`' slots."""
        return sum(self.supervisor.in_flight(m) + self.admission.depth(m) for m in models)

    # -- the order ---------------------------------------------------------------------------------------------------

    def _enqueue(self, model: str, evicting: tuple[str, ...]) -> None:
        """A swap for `model` at the end of the order (its turn now when it is the first)."""
        if any(s.model == model for s in self._swaps):
            return
        self._swaps.append(_Swap(model, frozenset(evicting[:MAX_EVICTING])))
        self._advance()

    def _own(self, model: str, mine: _Swap | None) -> _Swap:
        """The swap this request waits on: its model's (joined once), one made for it if its model is not loaded and
        others wait (it queues behind them, evicting what it will find in its way then: nothing known yet)."""
        swap = next((s for s in self._swaps if s.model == model), None)
        if swap is None:
            swap = _Swap(model, frozenset())
            self._swaps.append(swap)
            self._advance()
        if swap is not mine:
            if mine is not None:
                self._leave(mine)
            swap.waiters += 1
        return swap

    def _advance(self) -> None:
        """The head's turn starts when it becomes the head."""
        if self._swaps and self._swaps[0].turn_at is None:
            self._swaps[0].turn_at = self.clock()
        self.nudge()

    def _leave(self, swap: _Swap) -> None:
        """A request no longer waits on `swap` (served, refused or gone): a swap nobody waits on goes."""
        swap.waiters -= 1
        if swap.waiters <= 0:
            self._drop(swap)

    def _drop(self, swap: _Swap) -> None:
        if swap in self._swaps:
            self._swaps.remove(swap)
            swap.recalls.clear()  # nothing left to be served ahead of: nobody is recalled for it
            self._advance()

    async def _wait(self, deadline: float, hold_s: float) -> None:
        """Until something changes, the head's hold runs out, the deadline, or RECHECK_S, whichever is first."""
        changed = self._changed
        limit = min(RECHECK_S, max(0.0, deadline - self.clock()))
        if self._swaps and (left := hold_left_s(self._swaps[0].view(), self.clock(), hold_s)) is not None:
            limit = min(limit, left)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit):
                await changed.wait()

    # -- what is recorded ---------------------------------------------------------------------------------------------

    def _record_held(self, call: Traced, swap: _Swap, seen: set[tuple[str, int]], hold_s: float) -> None:
        position = self._swaps.index(swap)
        if not _once(seen, f"held{position == 0}", swap):
            return
        evicting = sorted(swap.evicting)
        call.emit(RequestSwapHeld(
            trace_id=call.trace_id, model=swap.model, evicting=evicting, position=position, hold_s=hold_s,
            in_flight=sum(self.supervisor.in_flight(m) for m in evicting),
            queued=sum(self.admission.depth(m) for m in evicting)))

    def _record_release(self, call: Traced, swap: _Swap, seen: set[tuple[str, int]], hold_s: float) -> None:
        if swap.ended is None or swap.turn_at is None or not _once(seen, "released", swap):
            return
        call.emit(RequestSwapReleased(
            trace_id=call.trace_id, model=swap.model, reason=swap.ended, hold_s=hold_s,
            held_ms=round(max(0.0, swap.ended_at - swap.turn_at) * 1000, 3), served_ahead=swap.served_ahead))

    def _timed_out(self, model: str, queue: Queue) -> Refused:
        waiting = [s.model for s in self._swaps]
        return Refused(f"{model}: no room within {queue.queue_timeout_s:g} s (swaps waiting: "
                       f"{', '.join(waiting) or 'none'})", reason="queue_timeout", http_status=503,
                       retry_after_s=float(max(1, round(queue.swap_hold_s))),
                       observations={"model": model, "swaps_waiting": waiting[:MAX_EVICTING]})


def _once(seen: set[tuple[str, int]], what: str, swap: _Swap) -> bool:
    """True the first time `what` is seen for `swap` on one trace."""
    key = (what, id(swap))
    if key in seen:
        return False
    seen.add(key)
    return True
