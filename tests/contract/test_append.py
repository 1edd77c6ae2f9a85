"""Appending: the durable path, the group-commit path, and seqs that stay gap-free across writer processes."""

from __future__ import annotations

import asyncio
import itertools

from blazar.clock import FakeClock
from blazar.events.base import Recorded
from blazar.events.log import EventLog
from blazar.events.writer import GroupCommitWriter
from tests.contract.backends import Backend
from tests.contract.workload import actor, aliased, index_of, received, spawn

PROCESSES = 2
PER_PROCESS = 200


async def _all(log: EventLog) -> list[Recorded]:
    return [rec async for rec in log.read()]


async def test_durable_append_returns_the_envelope_it_committed(event_log: EventLog, clock: FakeClock) -> None:
    first = await event_log.append(aliased("a", 0), actor="cli:alice", trace_id="t-1")
    clock.advance(1.5)
    more = await event_log.append([aliased("a", 1), aliased("b", 2)], actor="daemon", cause=first[0].seq)
    assert [r.seq for r in first + more] == [1, 2, 3]
    t0 = first[0].ts
    assert [(r.actor, r.trace_id, r.stream, r.cause, r.ts) for r in first + more] == [
        ("cli:alice", "t-1", "model:a", None, t0),
        ("daemon", None, "model:a", 1, t0 + 1.5),
        ("daemon", None, "model:b", 1, t0 + 1.5),
    ]
    assert await _all(event_log) == first + more  # what append returned is exactly what the log holds
    assert await event_log.last_seq() == 3


async def test_durable_append_is_visible_to_a_freshly_opened_log(backend: Backend, event_log: EventLog) -> None:
    written = await event_log.append([aliased("a", i) for i in range(3)], actor=actor("a"))
    fresh = await backend.open()  # opened after the append returned, while the writer is still open
    try:
        assert [r.to_json() for r in await _all(fresh)] == [r.to_json() for r in written]
    finally:
        await fresh.close()


async def test_durable_append_survives_its_process_dying_without_close(backend: Backend) -> None:
    child = await spawn(backend, "append", "dead", 5, die=True)  # os._exit after the last append returns
    await child.ready()
    seqs = await child.result()
    assert seqs == [1, 2, 3, 4, 5]
    fresh = await backend.open()
    try:
        recs = await _all(fresh)
    finally:
        await fresh.close()
    assert [(r.seq, r.actor, r.event) for r in recs] == [(i + 1, actor("dead"), aliased("dead", i)) for i in range(5)]


async def test_group_commit_writes_everything_submitted_in_order_with_contiguous_seqs(
    backend: Backend, event_log: EventLog
) -> None:
    writer = GroupCommitWriter(event_log, interval=0.002, max_batch=64)
    writer.start()
    events = [received("g", i) for i in range(500)]
    for ev in events:
        writer.submit(ev, actor=actor("g"), trace_id=ev.trace_id)
    assert writer.pending_count == 500  # submit never awaits: nothing is committed yet
    await asyncio.wait_for(writer.stop(), 10)
    assert (writer.committed, writer.pending_count, writer.dropped, writer.failures) == (500, 0, 0, 0)
    assert writer.batches >= 500 // 64

    fresh = await backend.open()
    try:
        recs = await _all(fresh)
    finally:
        await fresh.close()
    assert [r.seq for r in recs] == list(range(1, 501))
    assert [r.event for r in recs] == events
    assert [(r.trace_id, r.stream) for r in recs] == [(ev.trace_id, f"trace:{ev.trace_id}") for ev in events]


async def test_group_commit_and_durable_appends_share_one_sequence(event_log: EventLog) -> None:
    writer = GroupCommitWriter(event_log, interval=0.002, max_batch=8)
    writer.start()
    durable: list[int] = []
    for i in range(40):
        writer.submit(received("g", i), actor=actor("g"))
        if i % 5 == 4:
            (rec,) = await event_log.append(aliased("d", i), actor=actor("d"))
            durable.append(rec.seq)
    await asyncio.wait_for(writer.stop(), 10)
    recs = await _all(event_log)
    assert [r.seq for r in recs] == list(range(1, 49))
    assert [r.seq for r in recs if r.actor == actor("d")] == durable
    assert [index_of(r.event) for r in recs if r.actor == actor("g")] == list(range(40))


async def test_two_writer_processes_appending_at_once_get_gap_free_increasing_seqs(backend: Backend) -> None:
    # One child appends durably, one event per transaction; the other through the group-commit writer.
    children = [await spawn(backend, mode, tag, PER_PROCESS, wait=True)
                for mode, tag in (("append", "p1"), ("group", "p2"))]
    try:
        for child in children:
            await child.ready()
        for child in children:
            await child.go()
        durable_seqs, _ = [await child.result() for child in children]
    finally:
        for child in children:
            await child.kill()

    fresh = await backend.open()
    try:
        recs = await _all(fresh)
        assert await fresh.last_seq() == PROCESSES * PER_PROCESS
    finally:
        await fresh.close()
    assert [r.seq for r in recs] == list(range(1, PROCESSES * PER_PROCESS + 1))
    by_writer = {tag: [r for r in recs if r.actor == actor(tag)] for tag in ("p1", "p2")}
    # Each writer's events are all there, in the order it wrote them, with strictly increasing seqs.
    for tag in ("p1", "p2"):
        assert [index_of(r.event) for r in by_writer[tag]] == list(range(PER_PROCESS)), tag
    assert durable_seqs == [r.seq for r in by_writer["p1"]]
    assert durable_seqs == sorted(set(durable_seqs))
    # The writers really did append at the same time: their events are interleaved, not one run after the other.
    switches = sum(1 for a, b in itertools.pairwise(recs) if a.actor != b.actor)
    assert switches >= 2, f"the two writers did not overlap (actor changes: {switches})"
