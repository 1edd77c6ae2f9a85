"""One model's wait queue (blazar/serving/admission.py) and the order it is served in: requests with a deadline first,
earliest first (EDF); then by priority, highest first; and within one priority, by weighted fair share over the
tenants (each key, the keyless caller as one), so that a key that sends a hundred requests at once does not put
everyone else behind them. In memory, pure (no clock: the order depends on tokens charged, not on time).

The share is start-time fair queuing charged in tokens (prompt + generated). Each tenant has a virtual finish `F`:
the service charged to it so far over its weight. A grant starts at `S = max(V, F)` and moves `F` to `S + cost /
weight`; `V`, the virtual time, is the start of the latest grant. The next waiter served is the head of the tenant
whose `max(V, F)` is least (arrival breaks ties). A grant is charged an estimate (what the model's requests have
cost on average) and corrected to what the request really cost when its slot is given back. A tenant that was idle
starts at `V`, not at its old `F`: credit cannot be saved up while idle and spent in a burst.

With `fair=False` the queue is today's order before fair share: priority, then arrival (FIFO), whoever sends.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

# Weight of the newest request's cost in the queue's estimate of what a request costs.
_COST_ALPHA = 0.2
KEYLESS = ""  # the tenant of callers without a key (keys off, the CLI's admin token)


@dataclass(eq=False)
class Waiting:
    """What orders a waiter: its deadline (EDF), priority, arrival and tenant. `passed_by_share` counts the requests
    of other tenants, queued after it at its priority, that were admitted before it (their share came first)."""

    priority: int
    seq: int
    tenant: str = KEYLESS
    weight: int = 1
    deadline: float | None = None
    passed_by_share: int = field(default=0, init=False)

    def done(self) -> bool:
        """Whether it no longer waits (admitted meanwhile or gone); a done waiter is dropped from the queue."""
        return False

    @property
    def rank(self) -> tuple[int, float, int]:
        """Deadlines first, earliest first (EDF); then the rest by priority, then arrival."""
        if self.deadline is not None:
            return (0, self.deadline, self.seq)
        return (1, -self.priority, self.seq)

    def same_class(self, other: Waiting) -> bool:
        """Whether the two compete by share: neither has a deadline and their priority is the same."""
        return self.deadline is None and other.deadline is None and self.priority == other.priority


@dataclass(frozen=True)
class Charge:
    """What a grant charged a tenant: settled when the slot is given back (`FairQueue.settle`)."""

    tenant: str
    weight: int
    tokens: float  # the estimate charged at the grant


W = TypeVar("W", bound=Waiting)


class FairQueue(Generic[W]):
    """The waiters of one model, kept by rank (arrival within a priority); `head()` is the one served next."""

    def __init__(self, *, fair: bool = True) -> None:
        self.fair = fair
        self._waiters: list[W] = []
        self._finish: dict[str, float] = {}  # a tenant's virtual finish; absent: at V (idle, or never charged)
        self._vtime = 0.0
        self._cost: float | None = None  # tokens a request of this model costs, on average (EWMA)

    def __len__(self) -> int:
        return len(self._waiters)

    def __iter__(self) -> Iterator[W]:
        """The waiters by rank (not the fair order: see `position`)."""
        return iter(self._waiters)

    def add(self, waiter: W) -> None:
        bisect.insort(self._waiters, waiter, key=lambda w: w.rank)

    def remove(self, waiter: W) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def head(self) -> W | None:
        """The waiter served next, or None. Done waiters are dropped here: a cancelled one's task may not have run
        its cleanup yet."""
        self._waiters = [w for w in self._waiters if not w.done()]
        if not self._waiters:
            return None
        first = self._waiters[0]
        if not self.fair or first.deadline is not None:
            return first
        heads: dict[str, W] = {}
        for w in self._waiters:
            if not w.same_class(first):
                break  # ranked after the first's priority: their turn comes once it has no waiter left
            heads.setdefault(w.tenant, w)
        return min(heads.values(), key=lambda w: (self._start(w.tenant), w.seq))

    def position(self, waiter: W) -> int:
        """Its place (1 = next) in the order the queue would serve its waiters now, if no one else came: those
        ranked in an earlier class (deadline, higher priority) and, in its own, the turns the tenants' shares give
        before its own."""
        live = [w for w in self._waiters if not w.done()]
        before = sum(1 for w in live if w.rank < waiter.rank and not w.same_class(waiter))
        if not self.fair or waiter.deadline is not None:
            return 1 + sum(1 for w in live if w.rank < waiter.rank)
        # Serve the class on paper: each tenant's waiters in arrival order, the least virtual start first.
        queues: dict[str, list[W]] = {}
        for w in live:
            if w.same_class(waiter):
                queues.setdefault(w.tenant, []).append(w)
        finish, vtime, cost = dict(self._finish), self._vtime, self.estimate()
        turns = 0
        while True:
            tenant = min((t for t in queues if queues[t]),
                         key=lambda t: (max(vtime, finish.get(t, vtime)), queues[t][0].seq))
            nxt = queues[tenant].pop(0)
            turns += 1
            if nxt is waiter:
                return before + turns
            vtime = max(vtime, finish.get(tenant, vtime))
            finish[tenant] = vtime + cost / nxt.weight

    def grant(self, waiter: W) -> Charge:
        """The waiter is admitted: out of the queue, its tenant charged; the waiters of other tenants it passed (same
        class, queued before it) count it."""
        self.remove(waiter)
        for w in self._waiters:
            if w.seq < waiter.seq and w.tenant != waiter.tenant and w.same_class(waiter) and not w.done():
                w.passed_by_share += 1
        return self.charge(waiter.tenant, waiter.weight)

    def charge(self, tenant: str, weight: int) -> Charge:
        """A request of `tenant` admitted (from the queue or at once): charged what a request costs on average."""
        start = self._start(tenant)
        cost = self.estimate()
        self._vtime = start
        self._finish[tenant] = start + cost / weight
        self._forget_idle()
        return Charge(tenant=tenant, weight=weight, tokens=cost)

    def settle(self, charge: Charge, tokens: int | None) -> None:
        """The slot is given back: the charge corrected to what the request cost (`tokens`, prompt + generated;
        None: unknown, the estimate stands; 0: it served nothing), and the estimate taught by it."""
        if tokens is None:
            return
        self._cost = float(tokens) if self._cost is None else self._cost + _COST_ALPHA * (tokens - self._cost)
        base = self._finish.get(charge.tenant, self._vtime)
        self._finish[charge.tenant] = base + (tokens - charge.tokens) / charge.weight
        self._forget_idle()

    def estimate(self) -> float:
        """Tokens a request is charged at its grant: the measured average, at least 1 (a request's own worth before
        any was measured)."""
        return max(1.0, self._cost or 1.0)

    def _start(self, tenant: str) -> float:
        return max(self._vtime, self._finish.get(tenant, self._vtime))

    def _forget_idle(self) -> None:
        """A tenant whose finish is not ahead of V would start at V anyway: forgetting it keeps the table to the
        tenants served lately, and their credit unhoarded."""
        waiting = {w.tenant for w in self._waiters}
        for tenant in [t for t, f in self._finish.items() if f <= self._vtime and t not in waiting]:
            del self._finish[tenant]
