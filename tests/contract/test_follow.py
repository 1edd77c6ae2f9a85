"""`follow()`: a live tail that delivers, in seq order and once each, the events appended after it started,
whether this log, another `EventLog` on the same backend, or another process appended them."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from blazar.events.base import Recorded
from blazar.events.log import EventLog
from blazar.events.requests import RequestReceived
from tests.contract.backends import Backend
from tests.contract.workload import actor, aliased, index_of, received, spawn

POLL_S = 0.02
TAIL_TIMEOUT_S = 10.0


class Tail:
    """`log.follow(...)` running in a task until it has delivered `count` events (bounded in time)."""

    def __init__(self, log: EventLog, count: int, **kwargs: Any) -> None:
        self.got: list[Recorded] = []
        self._started = asyncio.Event()
        self._task = asyncio.create_task(self._run(log, count, kwargs))

    async def _run(self, log: EventLog, count: int, kwargs: dict[str, Any]) -> None:
        # follow() is an async generator (typed as an AsyncIterator): closed here, not left to the garbage collector.
        tail_gen = log.follow(poll_interval=POLL_S, **kwargs)
        async with contextlib.aclosing(tail_gen) as tail:  # type: ignore[type-var]
            self._started.set()
            async for rec in tail:
                self.got.append(rec)
                if len(self.got) == count:
                    return

    async def started(self) -> None:
        await asyncio.wait_for(self._started.wait(), TAIL_TIMEOUT_S)
        await asyncio.sleep(POLL_S * 2)  # the tail has read what was there and is waiting for more

    async def done(self) -> list[Recorded]:
        await asyncio.wait_for(self._task, TAIL_TIMEOUT_S)
        return self.got


async def test_follow_delivers_what_was_there_then_each_new_append_in_order(event_log: EventLog) -> None:
    old = await event_log.append([aliased("a", 0), aliased("a", 1)], actor=actor("a"))
    tail = Tail(event_log, 5)
    await tail.started()
    new = await event_log.append(aliased("a", 2), actor=actor("a"))
    new += await event_log.append([aliased("a", 3), aliased("a", 4)], actor=actor("a"))
    assert await tail.done() == old + new


async def test_follow_after_a_seq_delivers_only_later_events(event_log: EventLog) -> None:
    await event_log.append([aliased("a", i) for i in range(3)], actor=actor("a"))
    tail = Tail(event_log, 2, after=await event_log.last_seq())
    await tail.started()
    new = await event_log.append([aliased("a", 3), aliased("a", 4)], actor=actor("a"))
    assert await tail.done() == new


async def test_follow_delivers_appends_from_another_log_and_another_process_in_order(
    backend: Backend, event_log: EventLog, second_log: EventLog
) -> None:
    tail = Tail(event_log, 3 + 4 + 2, after=0)
    await tail.started()
    await second_log.append([aliased("other", i) for i in range(3)], actor=actor("other"))
    child = await spawn(backend, "append", "child", 4)
    await child.ready()
    child_seqs = await child.result()
    await event_log.append([aliased("self", 0), aliased("self", 1)], actor=actor("self"))
    got = await tail.done()
    assert [r.seq for r in got] == list(range(1, 10))
    assert [r.actor for r in got] == [actor("other")] * 3 + [actor("child")] * 4 + [actor("self")] * 2
    assert [r.seq for r in got if r.actor == actor("child")] == child_seqs
    assert [index_of(r.event) for r in got] == [0, 1, 2, 0, 1, 2, 3, 0, 1]


async def test_follow_with_filters_delivers_only_matching_events(event_log: EventLog, second_log: EventLog) -> None:
    tail = Tail(event_log, 3, types=[RequestReceived.TYPE], trace_id="t-1")
    await tail.started()
    for i in range(4):
        ev = received("t", i)
        await second_log.append(ev, actor="gateway", trace_id=f"t-{i % 2}")
        await second_log.append(aliased("m", i), actor="cli:alice", trace_id="t-1")
    await second_log.append(received("t", 9), actor="gateway", trace_id="t-1")
    got = await tail.done()
    assert [(r.seq, r.type, r.trace_id) for r in got] == [(3, RequestReceived.TYPE, "t-1"),
                                                           (7, RequestReceived.TYPE, "t-1"),
                                                           (9, RequestReceived.TYPE, "t-1")]


async def test_this_process_commits_reach_the_tail_without_a_read_back(event_log: EventLog, monkeypatch: Any) -> None:
    reads = 0
    real_read = EventLog.read

    def counting_read(self: EventLog, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return real_read(self, **kwargs)

    monkeypatch.setattr(EventLog, "read", counting_read)
    tail = Tail(event_log, 10)
    await tail.started()
    new = []
    for i in range(10):
        new += await event_log.append(aliased("a", i), actor=actor("a"))
        await asyncio.sleep(POLL_S * 1.5)  # a quiet poll between commits: the stat sees them, data_version says ours
    assert await tail.done() == new
    assert reads == 1  # the catch-up at the start, and no read per commit


async def test_another_logs_commit_between_this_ones_is_read_in_its_place(
    event_log: EventLog, second_log: EventLog
) -> None:
    tail = Tail(event_log, 5, after=0)
    await tail.started()
    for who, log_ in (("self", event_log), ("other", second_log), ("self", event_log), ("other", second_log),
                      ("self", event_log)):
        await log_.append(aliased(who, 0), actor=actor(who))  # back to back: no quiet poll in between
    got = await tail.done()
    assert [r.seq for r in got] == [1, 2, 3, 4, 5]
    assert [r.actor for r in got] == [actor(w) for w in ("self", "other", "self", "other", "self")]


async def test_a_tail_that_falls_behind_its_buffer_reads_the_rest_in_order(
    event_log: EventLog, monkeypatch: Any
) -> None:
    monkeypatch.setattr("blazar.events.log.FOLLOW_BUFFER", 4)
    got: list[int] = []
    gate = asyncio.Event()

    async def slow() -> None:
        async with contextlib.aclosing(event_log.follow(poll_interval=POLL_S)) as tail:  # type: ignore[type-var]
            async for rec in tail:
                got.append(rec.seq)
                await gate.wait()  # held after the first: the commits below overrun the buffer of 4
                if len(got) == 20:
                    return

    task = asyncio.create_task(slow())
    first = await event_log.append(aliased("a", 0), actor=actor("a"))
    await asyncio.sleep(POLL_S * 3)
    for i in range(1, 20):
        await event_log.append(aliased("a", i), actor=actor("a"))
    gate.set()
    await asyncio.wait_for(task, TAIL_TIMEOUT_S)
    assert got == list(range(first[0].seq, first[0].seq + 20))


async def test_filters_apply_to_this_process_commits_too(event_log: EventLog) -> None:
    tail = Tail(event_log, 2, types=[RequestReceived.TYPE], trace_id="t-1")
    await tail.started()
    await event_log.append(received("t", 0), actor="gateway", trace_id="t-0")
    await event_log.append(aliased("m", 0), actor="cli:alice", trace_id="t-1")
    one = await event_log.append(received("t", 1), actor="gateway", trace_id="t-1")
    await event_log.append(received("t", 2), actor="gateway", trace_id="t-2")
    two = await event_log.append(received("t", 3), actor="gateway", trace_id="t-1")
    assert await tail.done() == one + two
