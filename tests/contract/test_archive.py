"""Archiving on every store: request history older than the cutoff leaves the live log for a verified segment,
every read answers as before, the one delete path is guarded, and an altered or missing segment is said."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from blazar.clock import FakeClock
from blazar.errors import AppendOnlyViolation, SegmentBroken, SegmentMissing
from blazar.events.archive import LogArchived
from blazar.events.base import Recorded
from blazar.events.log import EventLog
from blazar.operations.archive import archive
from tests.contract.seeded import CASES, T0, seed, seqs
from tests.contract.workload import aliased, received


@pytest.fixture
async def seeded(event_log: EventLog, clock: FakeClock) -> list[Recorded]:
    assert clock.now() == T0
    return await seed(event_log, clock)


async def _live_seqs(log: EventLog) -> list[int]:
    return [r[0] for r in await log._fetch("SELECT seq FROM events ORDER BY seq")]


async def test_archiving_moves_old_request_events_and_records_it_first(
        event_log: EventLog, seeded: list[Recorded]) -> None:
    run = await archive(event_log, cutoff=T0 + 50, now=T0 + 100)
    assert [s.count for s in run.segments] == [2]
    (seg,) = run.segments
    assert (seg.first_seq, seg.last_seq, seg.segment) == (1, 6, 1)
    # seqs 3 and 4 (request.received at T0+10) left; 7 (T0+60) is newer than the cutoff; control events stay.
    assert await _live_seqs(event_log) == [1, 2, 5, 6, 7, 8, 9, 10]
    (rec,) = [r async for r in event_log.read(after=9)]
    assert isinstance(rec.event, LogArchived) and rec.event.sha256 == seg.sha256
    assert [r.name for r in await event_log.archived_ranges()] == [seg.name]
    # A second run finds nothing new to move.
    again = await archive(event_log, cutoff=T0 + 50, now=T0 + 200)
    assert again.segments == [] and await event_log.last_seq() == 10


async def test_an_event_recorded_out_of_clock_order_before_the_cutoff_goes_in_the_first_run(
        event_log: EventLog, clock: FakeClock) -> None:
    # Found by test_archive_props: ranges ended at the newest event *by time* before the cutoff, so one recorded
    # later with an earlier time (another process's clock behind) stayed live, and a second run with the same
    # cutoff moved it. A range ends at the last event by seq recorded before the cutoff: one run does it all.
    for i, ts in enumerate((T0 + 10, T0 + 20, T0 + 5, T0 + 90)):
        clock.advance(ts - clock.now())
        await event_log.append(received(f"t{i}", 0), actor="gateway", trace_id=f"t{i}-0000")
    run = await archive(event_log, cutoff=T0 + 15, now=T0 + 100)
    assert [(s.first_seq, s.last_seq, s.count) for s in run.segments] == [(1, 3, 3)]
    assert await _live_seqs(event_log) == [4, 5]  # the newer request, and the log.archived event
    assert (await archive(event_log, cutoff=T0 + 15, now=T0 + 200)).segments == []


@pytest.mark.parametrize(("filters", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_every_read_answers_as_before_archiving(
        event_log: EventLog, seeded: list[Recorded], filters: dict[str, Any], expected: list[int]) -> None:
    await archive(event_log, cutoff=T0 + 70, now=T0 + 100)
    assert 3 not in await _live_seqs(event_log) and 7 not in await _live_seqs(event_log)
    for batch in (1, 2, 3, 5000):  # seq 10 is the log.archived event itself
        assert [s for s in await seqs(event_log, batch=batch, **filters) if s != 10] == expected, batch


async def test_records_lookups_and_time_answer_across_the_archive(
        event_log: EventLog, seeded: list[Recorded]) -> None:
    await archive(event_log, cutoff=T0 + 70, now=T0 + 100)
    assert [r async for r in event_log.read(upto=9)] == seeded
    assert await event_log.has_trace("t1-0000") and await event_log.has_trace("t2-0000")
    assert not await event_log.has_trace("t1-000")
    assert await event_log.trace_ids_starting("t", limit=5) == ["t1-0000", "t2-0000"]
    assert await event_log.seq_at_time(T0 + 10) == 4
    assert await event_log.seq_at_time(T0 + 65) == 7
    assert await event_log.event_anchor(4) == ("request.received", T0 + 10)


async def test_segments_chain_one_to_the_next(event_log: EventLog, clock: FakeClock,
                                              seeded: list[Recorded]) -> None:
    first = (await archive(event_log, cutoff=T0 + 50, now=T0 + 100)).segments[0]
    clock.advance(100)
    await event_log.append(received("t9", 0), actor="gateway", trace_id="t9-0000")
    second = (await archive(event_log, cutoff=clock.now() + 1, now=clock.now())).segments
    assert [s.segment for s in second] == [2]
    assert second[0].prev == first.head and second[0].first_seq == first.last_seq + 1
    assert await seqs(event_log, trace_id="t9-0000") == [11]


async def test_a_segment_of_many_blocks_and_segments_reads_back_in_order(
        event_log: EventLog, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("blazar.events.segment.BLOCK_EVENTS", 7)
    for i in range(60):
        await event_log.append(received("bulk", i), actor="gateway", trace_id=f"bulk-{i:04d}")
        if i % 10 == 0:
            await event_log.append(aliased("ctl", i), actor="cli")
        clock.advance(1)
    before = [r async for r in event_log.read()]
    cutoff = clock.now() - 5
    run = await archive(event_log, cutoff=cutoff, now=clock.now(), segment_events=25)
    assert [s.count for s in run.segments] == [25, 25, 5]  # 55 request events before the cutoff
    assert sum(1 for r in before if r.ts < cutoff and r.type == "request.received") == 55
    assert [r async for r in event_log.read()] == before + [r async for r in event_log.read(after=len(before))]
    got = [r async for r in event_log.read(upto=len(before))]
    assert got == before
    assert [r.seq async for r in event_log.read(trace_id="bulk-0033")] == [b.seq for b in before
                                                                            if b.trace_id == "bulk-0033"]


async def test_the_log_refuses_a_delete_outside_an_archived_range(event_log: EventLog,
                                                                 seeded: list[Recorded]) -> None:
    with pytest.raises((AppendOnlyViolation, Exception)) as info:
        await event_log._execute_write("DELETE FROM events WHERE seq = 3")
    assert "append-only" in str(info.value)
    await archive(event_log, cutoff=T0 + 50, now=T0 + 100)
    for seq in (5, 10):  # a control event inside the range; the log.archived row itself
        with pytest.raises(Exception, match="append-only"):
            await event_log._execute_write(f"DELETE FROM events WHERE seq = {seq}")
    with pytest.raises(Exception, match="append-only"):
        await event_log._execute_write("DELETE FROM archived")
    assert await _live_seqs(event_log) == [1, 2, 5, 6, 7, 8, 9, 10]


async def test_an_altered_or_missing_segment_is_named_when_read(event_log: EventLog, seeded: list[Recorded]) -> None:
    (seg,) = (await archive(event_log, cutoff=T0 + 50, now=T0 + 100)).segments
    assert event_log.archive is not None
    data = event_log.archive.path(seg.name, ".jsonl.gz")
    raw = bytearray(data.read_bytes())
    raw[-12] ^= 0xFF
    data.write_bytes(bytes(raw))
    event_log.archive.forget()
    with pytest.raises(SegmentBroken, match=seg.name):
        await seqs(event_log, trace_id="t1-0000")
    data.unlink()
    with pytest.raises(SegmentMissing, match=seg.name):
        await seqs(event_log)
    # Reads that do not reach the archived range never open it.
    assert await seqs(event_log, after=6) == [7, 8, 9, 10]


async def test_a_copy_of_an_archived_log_keeps_its_ranges_and_reads_the_same(
        event_log: EventLog, seeded: list[Recorded], tmp_path: Any) -> None:
    """`snapshot_into` (PostgreSQL's copy into the snapshot's SQLite file; SQLite's VACUUM INTO) carries the live rows
    and the archived ranges; opened on the same archive, the copy reads like the original."""
    from blazar.events.log_sqlite import SqliteEventLog

    await archive(event_log, cutoff=T0 + 70, now=T0 + 100)
    before = [r async for r in event_log.read()]
    target = tmp_path / "copy.db"
    await event_log.snapshot_into(target)
    assert event_log.archive is not None
    copy = await SqliteEventLog.open(target, archive=event_log.archive.root)
    try:
        assert [r async for r in copy.read()] == before
        assert [r.name for r in await copy.archived_ranges()] == [r.name for r in await event_log.archived_ranges()]
        # The copy goes on gap-free from its last seq.
        (rec,) = await copy.append(aliased("after", 0), actor="cli")
        assert rec.seq == before[-1].seq + 1
    finally:
        await copy.close()


async def test_one_archive_run_at_a_time_even_across_archive_directories(
        event_log: EventLog, second_log: EventLog, seeded: list[Recorded], tmp_path: Any) -> None:
    """Nodes sharing a PostgreSQL log may keep separate archive directories: the log's own lock still lets one run
    at a time (SQLite: one machine, the directory's lock)."""
    from blazar.errors import ArchiveBusy
    from blazar.events.segment_store import SegmentStore

    second_log.archive = SegmentStore(tmp_path / "elsewhere")
    started, release = asyncio.Event(), asyncio.Event()

    async def slow_first() -> Any:
        async with event_log.archive_lock():
            started.set()
            await release.wait()

    task = asyncio.create_task(slow_first())
    await started.wait()
    if event_log.backend == "postgresql":
        with pytest.raises(ArchiveBusy, match="archive lock"):
            await archive(second_log, cutoff=T0 + 50, now=T0 + 100)
    release.set()
    await task
    run = await archive(second_log, cutoff=T0 + 50, now=T0 + 100)
    assert [s.count for s in run.segments] == [2]


async def test_the_index_across_segments_finds_a_trace_in_one_look_up_and_is_rebuilt_at_will(
        event_log: EventLog, clock: FakeClock, seeded: list[Recorded]) -> None:
    first = (await archive(event_log, cutoff=T0 + 50, now=T0 + 100)).segments[0]
    clock.advance(100)
    await event_log.append(received("t9", 0), actor="gateway", trace_id="t9-0000")
    second = (await archive(event_log, cutoff=clock.now() + 1, now=clock.now())).segments[0]
    store = event_log.archive
    assert store is not None
    ranges = await event_log.archived_ranges()
    assert [r.name for r in store.with_trace(ranges, "t9-0000")] == [second.name]
    assert [r.name for r in store.with_trace(ranges, "t1-0000")] == [first.name]
    assert store.with_trace(ranges, "nope") == []
    index = store.root / "traces.index"
    # Derived: deleted, it is made again; one that lists another archive's segment (another sha256) is rebuilt.
    index.unlink()
    store.forget()
    assert await seqs(event_log, trace_id="t9-0000") == [11] and index.is_file()
    import sqlite3

    with sqlite3.connect(index) as conn:
        conn.execute("UPDATE covered SET sha256 = 'other' WHERE segment = 1")
        conn.execute("DELETE FROM traces WHERE segment = 1")
    store.forget()
    assert await event_log.has_trace("t1-0000")
    assert await seqs(event_log, trace_id="t1-0000") == [3, 4, 5]
