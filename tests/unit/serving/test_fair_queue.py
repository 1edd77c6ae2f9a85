"""The order a model's queue serves its waiters in (blazar/serving/fair_queue.py): weighted fair share over the
tenants within a priority, charged in tokens; deadlines (EDF) and priorities as before; no credit saved while idle;
the position a waiter is told is the place it is served at. Pure: no clock, no event loop."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from blazar.serving.fair_queue import FairQueue, Waiting


@dataclass(eq=False, kw_only=True)
class W(Waiting):
    gone: bool = False

    def done(self) -> bool:
        return self.gone


class Queue:
    """A queue with waiters numbered in arrival order; `serve(n)` grants the head n times, each settled at `cost`."""

    def __init__(self, *, fair: bool = True) -> None:
        self.q: FairQueue[W] = FairQueue(fair=fair)
        self._seq = itertools.count()

    def add(self, tenant: str, n: int = 1, *, weight: int = 1, priority: int = 0,
            deadline: float | None = None) -> list[W]:
        made = [W(priority=priority, seq=next(self._seq), tenant=tenant, weight=weight, deadline=deadline)
                for _ in range(n)]
        for w in made:
            self.q.add(w)
        return made

    def serve(self, n: int, cost: dict[str, int] | None = None) -> list[W]:
        served = []
        for _ in range(n):
            head = self.q.head()
            assert head is not None
            charge = self.q.grant(head)
            self.q.settle(charge, (cost or {}).get(head.tenant, 10))
            served.append(head)
        return served


def tenants(served: list[W]) -> list[str]:
    return [w.tenant for w in served]


def test_two_backlogged_tenants_of_equal_weight_take_turns() -> None:
    queue = Queue()
    queue.add("key:a", 30)
    queue.add("key:b", 30)
    served = tenants(queue.serve(40))
    assert Counter(served) == {"key:a": 20, "key:b": 20}
    assert all(served[i] != served[i + 1] for i in range(len(served) - 1))


def test_a_weight_of_3_is_served_three_times_the_tokens_of_a_weight_of_1() -> None:
    queue = Queue()
    queue.add("key:heavy", 100, weight=3)
    queue.add("key:light", 100, weight=1)
    counts = Counter(tenants(queue.serve(80)))
    assert counts["key:heavy"] == 60 and counts["key:light"] == 20


def test_shares_are_charged_in_tokens_what_the_requests_really_cost() -> None:
    """A tenant whose requests turn out ten times dearer (prompt + generated) gets a tenth of the turns."""
    queue = Queue()
    queue.add("key:long", 50)
    queue.add("key:short", 50)
    counts = Counter(tenants(queue.serve(44, cost={"key:long": 100, "key:short": 10})))
    assert counts["key:long"] <= 5 and counts["key:short"] >= 39


def test_a_newcomer_is_not_starved_by_a_flood() -> None:
    queue = Queue()
    queue.add("key:flood", 100)
    queue.serve(5)
    (late,) = queue.add("key:light")
    assert queue.q.position(late) == 1
    assert queue.q.head() is late
    served = queue.serve(1)
    assert served == [late]
    flood = [w for w in queue.q if w.tenant == "key:flood"]
    assert flood[0].passed_by_share == 1 and all(w.passed_by_share == 1 for w in flood)


def test_a_tenant_back_from_idle_has_saved_no_credit() -> None:
    """While it was away the other tenant was served alone; back, it takes turns with it rather than a burst."""
    queue = Queue()
    queue.add("key:a", 200)
    queue.add("key:b", 2)
    queue.serve(4)  # both served twice: b's queue is empty now
    queue.serve(50)  # a alone, for a long time
    queue.add("key:b", 20)
    served = tenants(queue.serve(10))
    assert Counter(served) == {"key:a": 5, "key:b": 5}


def test_the_position_told_is_the_place_served_at_if_no_one_else_comes() -> None:
    queue = Queue()
    queue.add("key:a", 3)
    queue.serve(1)
    queue.add("key:a", 6)
    queue.add("key:b", 3, weight=2)
    queue.add("", 2)
    queue.add("key:c", 1)
    positions = {w.seq: queue.q.position(w) for w in queue.q}
    waiting = len(queue.q)
    served = [w.seq for w in queue.serve(waiting, cost={})]
    assert [positions[s] for s in served] == list(range(1, waiting + 1))


def test_deadlines_go_first_earliest_first_whatever_the_share() -> None:
    queue = Queue()
    queue.add("key:b", 3)
    late_deadline = queue.add("key:flood", deadline=50.0)
    early_deadline = queue.add("key:flood", deadline=20.0)
    assert queue.q.position(early_deadline[0]) == 1 and queue.q.position(late_deadline[0]) == 2
    assert queue.serve(2) == early_deadline + late_deadline


def test_priorities_keep_their_meaning_and_share_counts_within_one_only() -> None:
    queue = Queue()
    low = queue.add("key:b", 2, priority=-10)
    queue.add("key:flood", 6)
    high = queue.add("key:flood", 2, priority=10)
    assert queue.q.position(low[0]) == 9
    served = queue.serve(10)
    assert served[:2] == high and served[-2:] == low


def test_background_waiters_are_served_after_every_interactive_one_and_share_among_themselves() -> None:
    queue = Queue()
    batch_a = queue.add("key:a", 4, priority=-1000)
    batch_b = queue.add("key:b", 1, priority=-1000)
    chat = queue.add("key:a", 2)
    served = queue.serve(7)
    assert served[:2] == chat
    # a's share paid for its chats: b's batch line goes before a's first, then they take turns
    assert served[2:5] == [batch_b[0], batch_a[0], batch_a[1]]


def test_without_fair_share_the_queue_serves_by_arrival_whoever_sends() -> None:
    queue = Queue(fair=False)
    flood = queue.add("key:flood", 10)
    (late,) = queue.add("key:light")
    assert queue.q.position(late) == 11
    assert queue.serve(11) == [*flood, late]
    assert all(w.passed_by_share == 0 for w in flood)


def test_a_waiter_gone_from_the_queue_is_skipped_and_takes_no_place() -> None:
    queue = Queue()
    a = queue.add("key:a", 2)
    b = queue.add("key:b", 2)
    b[0].gone = True
    assert queue.q.position(b[1]) == 2  # b's turn comes after a's first; its gone waiter takes no place
    assert tenants(queue.serve(3)) == ["key:a", "key:b", "key:a"]
    assert a[1] not in list(queue.q) and len(queue.q) == 0


def test_a_grant_that_served_nothing_is_refunded() -> None:
    """A slot given back unused (a cancelled waiter's, a request routed again) costs its tenant nothing."""
    queue = Queue()
    queue.add("key:a", 4)
    queue.add("key:b", 4)
    for _ in range(3):  # a's grants, each handed back unused
        head = queue.q.head()
        assert head is not None and head.tenant == "key:a"
        queue.q.settle(queue.q.grant(head), 0)
    assert queue.q.head() is not None and queue.q.head().tenant == "key:a"  # type: ignore[union-attr]


def test_the_table_of_tenants_forgets_those_served_long_ago() -> None:
    queue = Queue()
    for i in range(50):
        queue.add(f"key:{i}")
    queue.serve(50)
    queue.add("key:busy", 60)
    queue.serve(60)
    assert set(queue.q._finish) <= {"key:busy"}
