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
from collections import Counter
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
    """A turn in the order: what the rule sees, and what the coordinator keeps for it."""

    model: str
    evicting: frozenset[str]
    turn_at: float | None = None
    waiters: int = 0
    served_ahead: int = 0
    ended: Literal["drained", "expired"] | None = None
    ended_at: float = 0.0
    done: bool = False  # its model is loaded: its waiters go (counted as on their way until they do)
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
        # Requests cleared to use a model and not yet at its slots: what would be evicted under them counts them.
        self._on_way: Counter[str] = Counter()

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
        settled = False  # a waiter of a turn that ended (done) was counted on its way: uncounted once, here or below
        try:
            while True:
                now, hold_s = self.clock(), self.settings().swap_hold_s
                if mine is not None and mine.done and not settled:
                    self._record_release(call, mine, seen, hold_s)
                    settled = True
                    try:
                        return await self._going(model, ensure), None
                    except VictimsBusy as busy:  # its model went again before it got there: a turn once more
                        self._leave(mine)
                        mine = self._take_turn(model, "join", busy.models)
                        settled = False
                        continue
                    finally:
                        self._on_way[model] -= 1  # counted when its turn ended, on top of _going's own count
                # With no swap waiting every request goes on as ever: what is loaded is looked at only when one does.
                loaded = bool(self._swaps) and bool(self.supervisor.instances(model))
                entry = decide_entry(model, loaded, self.waiting(), now, hold_s)
                if entry == "go":
                    self._leave(mine)
                    mine = None
                    try:
                        return await self._going(model, ensure), None
                    except VictimsBusy as busy:
                        mine = self._take_turn(model, "join", busy.models)
                        continue
                head = self._swaps[0]
                if entry == "ahead":
                    self._leave(mine)
                    mine = None
                    try:
                        return await self._ahead(call, model, head, now, hold_s, ensure)
                    except VictimsBusy as busy:  # its model went in the meantime: a turn like any other
                        mine = self._take_turn(model, "join", busy.models)
                        continue
                if mine is None:
                    mine = self._take_turn(model, entry, ())
                    if loaded and _once(seen, "behind", mine):
                        call.emit(RequestSwapWaited(trace_id=call.trace_id, model=model, swap_model=head.model))
                        self.nudge()  # one recalled from a lane just left it: the head's demand fell
                self._record_held(call, mine, seen, hold_s, loaded)
                if mine is self._swaps[0]:
                    done = await self._head_step(mine, now, hold_s, ensure)
                    self._record_held(call, mine, seen, hold_s, loaded)
                    if done is not None:
                        inst, completed = done
                        settled = True
                        if not completed:  # another waiter's load ended the turn and counted this one on its way
                            self._on_way[model] -= 1
                        self._record_release(call, mine, seen, hold_s)
                        return inst, None
                self._record_release(call, mine, seen, hold_s)
                if self.clock() >= deadline:
                    raise self._timed_out(model, queue)
                await self._wait(deadline, hold_s)
        finally:
            if mine is not None and mine.done and not settled:
                self._on_way[model] -= 1
            self._leave(mine)

    async def _going(self, model: str, ensure: Callable[[], Awaitable[Instance]]) -> Instance:
        """`ensure()`, counted on its way to the model meanwhile."""
        self._on_way[model] += 1
        try:
            return await ensure()
        finally:
            self._on_way[model] -= 1

    async def _ahead(self, call: Traced, model: str, head: _Swap, now: float, hold_s: float,
                     ensure: Callable[[], Awaitable[Instance]]) -> tuple[Instance, asyncio.Event]:
        """Served ahead of the head's swap, with the recall its hold's end sets."""
        recall = asyncio.Event()
        head.recalls.append(recall)
        head.served_ahead += 1
        since = now - head.turn_at if head.turn_at is not None else 0.0
        call.emit(RequestServedAhead(trace_id=call.trace_id, model=model, swap_model=head.model, hold_s=hold_s,
                                     since_turn_ms=round(since * 1000, 3)))
        return await self._going(model, ensure), recall

    # -- the head --------------------------------------------------------------------------------------------------

    async def _head_step(self, swap: _Swap, now: float, hold_s: float,
                         ensure: Callable[[], Awaitable[Instance]]) -> tuple[Instance, bool] | None:
        """The head's step: its load tried once the models it evicts have drained (then its turn is over and its other
        waiters go), or its hold run out (what was served ahead and has no slot yet recalled). None: it waits on;
        else the instance, and whether this step ended the turn (another waiter's may have, meanwhile)."""
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
            inst = await self._going(swap.model, ensure)
        except VictimsBusy as busy:  # it learns what is in its way (or a request came in between): wait for it
            swap.evicting = frozenset(busy.models[:MAX_EVICTING])
            return None
        except BaseException:
            self._drop(swap)  # the load failed: the next turn (this one's other waiters try again)
            raise
        if swap.done:
            return inst, False
        self._end(swap, "drained", now)
        swap.done = True
        self._on_way[swap.model] += swap.waiters - 1  # the others: on their way, until they get there
        self._drop(swap)
        return inst, True

    def _end(self, swap: _Swap, reason: Literal["drained", "expired"], now: float) -> None:
        if swap.ended is None:
            swap.ended, swap.ended_at = reason, now

    def _demand(self, models: frozenset[str]) -> int:
        """The requests on `models`: running, holding or waiting for their slots, or on their way to them."""
        lanes = self.admission.snapshot()
        return sum(self.supervisor.in_flight(m) + int(lanes.get(m, {}).get("busy", 0))
                   + int(lanes.get(m, {}).get("queued", 0)) + self._on_way[m] for m in models)

    # -- the order ---------------------------------------------------------------------------------------------------

    def _take_turn(self, model: str, entry: str, evicting: tuple[str, ...]) -> _Swap:
        """The request's turn: the last one when it is its model's (`join`), else a new one at the end."""
        last = self._swaps[-1] if self._swaps else None
        if entry == "join" and last is not None and last.model == model:
            swap = last
        else:
            swap = _Swap(model, frozenset(evicting[:MAX_EVICTING]))
            self._swaps.append(swap)
            self._advance()
        swap.waiters += 1
        return swap

    def _advance(self) -> None:
        """The head's turn starts when it becomes the head."""
        if self._swaps and self._swaps[0].turn_at is None:
            self._swaps[0].turn_at = self.clock()
        self.nudge()

    def _leave(self, swap: _Swap | None) -> None:
        """A request no longer waits on `swap` (served, refused or gone): a turn nobody waits on goes."""
        if swap is None:
            return
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

    def _record_held(self, call: Traced, swap: _Swap, seen: set[tuple[str, int]], hold_s: float,
                     loaded: bool) -> None:
        """Its turn taken behind others (one for a loaded model said so with request.swap_waited), and its turn's
        hold started (once what is in its way is known)."""
        if swap not in self._swaps:
            return
        position = self._swaps.index(swap)
        if (position > 0 and loaded) or (position == 0 and not swap.evicting):
            return
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
