"""The archive runs the daemon schedules (`scheduled_run`, `archive_loop`) over a real log on the fake clock: nothing
while `request_retention` is 0, a run recorded and checkpointed after, a run that found another under way skipped
without a record, a failure recorded as log.archive_failed and the loop going on."""

from __future__ import annotations

import asyncio
import fcntl

import pytest

from blazar.context import Blazar
from blazar.events.archive import LogArchived, LogArchiveFailed
from blazar.events.requests import RequestCompleted, RequestReceived
from blazar.operations import archive_schedule
from blazar.operations.archive_schedule import scheduled_run
from blazar.operations.config import set_value
from tests.support.bounds import HANG_S

DAY_S = 86400.0


async def _old_traces(app: Blazar, n: int = 3) -> None:
    """`n` traces, then 40 days pass."""
    for i in range(n):
        tid = f"t{i}"
        await app.log.append(RequestReceived(trace_id=tid, dialect="openai", route="/v1/chat/completions", model="m"),
                             actor="gateway", trace_id=tid)
        await app.log.append(RequestCompleted(trace_id=tid, model="m", duration_ms=1.0), actor="gateway",
                             trace_id=tid)
    app.clock.advance(40 * DAY_S)


async def _of(app: Blazar, type_name: str) -> list:
    return [r async for r in app.log.read(types=[type_name])]


async def _recorded(app: Blazar, type_name: str, n: int) -> None:
    """Wait (at most 10 s) until the log holds `n` events of `type_name`."""
    landed = asyncio.Event()
    unsubscribe = app.log.subscribe(lambda batch: landed.set())
    try:
        async with asyncio.timeout(HANG_S):
            while True:
                landed.clear()
                if len(await _of(app, type_name)) >= n:
                    return
                await landed.wait()
    finally:
        unsubscribe()


async def test_retention_zero_never_archives(app: Blazar) -> None:
    await _old_traces(app)
    await set_value(app, "retention.request_retention", "0")
    assert await scheduled_run(app) is None
    assert await _of(app, "log.archived") == [] and await app.log.archived_ranges() == []


async def test_a_run_archives_records_and_checkpoints(app: Blazar) -> None:
    await _old_traces(app)
    run = await scheduled_run(app)
    assert run is not None and run.events == 6
    (rec,) = await _of(app, "log.archived")
    assert isinstance(rec.event, LogArchived) and rec.actor == "archiver"
    assert app.runner.seq >= rec.seq
    stored = await app.log.checkpoints.rows()
    assert stored and min(int(r[2]) for r in stored) >= rec.seq  # start-up folds from past the archived range
    again = await scheduled_run(app)  # nothing to move is no error
    assert again is not None and again.segments == []
    assert len(await _of(app, "log.archived")) == 1


async def test_nothing_old_enough_makes_no_archive_directory(app: Blazar) -> None:
    await _old_traces(app)
    app.clock.advance(-40 * DAY_S + 60)  # the traces are a minute old
    run = await scheduled_run(app)
    assert run is not None and run.segments == []
    assert app.log.archive is not None and not app.log.archive.root.exists()


async def test_a_run_under_way_is_skipped_without_a_record(app: Blazar) -> None:
    await _old_traces(app)
    assert app.log.archive is not None
    app.log.archive.root.mkdir(parents=True, exist_ok=True)
    with (app.log.archive.root / ".archive.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert await scheduled_run(app) is None
    assert await _of(app, "log.archived") == [] and await _of(app, "log.archive_failed") == []


async def test_a_failure_is_recorded_and_the_loop_goes_on(app: Blazar, monkeypatch: pytest.MonkeyPatch) -> None:
    await _old_traces(app)
    assert app.log.archive is not None
    root = app.log.archive.root
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_text("a file where the archive directory should be")
    monkeypatch.setattr(archive_schedule, "_until", _a_moment)  # rounds back to back
    loop = asyncio.create_task(archive_schedule.archive_loop(app))
    try:
        await _recorded(app, "log.archive_failed", 2)  # the loop survives a failed round
        (first, *_) = await _of(app, "log.archive_failed")
        assert isinstance(first.event, LogArchiveFailed) and first.event.segments == 0
        assert first.event.cutoff == app.clock.now() - 30 * DAY_S and first.event.reason
        root.unlink()  # the disk is fixed: the next round archives
        await _recorded(app, "log.archived", 1)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert len(await app.log.archived_ranges()) == 1


async def _a_moment(loop: asyncio.AbstractEventLoop, since: float, interval: object) -> None:
    await asyncio.sleep(0.01)


async def test_the_schedule_waits_for_a_segments_worth_unless_something_is_overdue(
        app: Blazar, monkeypatch: pytest.MonkeyPatch) -> None:
    """Due but not overdue (the oldest is less than a day past the 30-day cutoff) and fewer than a segment's worth:
    no run yet. A segment's worth, or something a day overdue: the run."""
    await _old_traces(app)
    app.clock.advance(-40 * DAY_S + 30.5 * DAY_S)  # the traces are 30.5 days old: due half a day ago
    run = await scheduled_run(app)
    assert run is not None and run.segments == [] and await app.log.archived_ranges() == []
    monkeypatch.setattr(archive_schedule, "SEGMENT_EVENTS", 6)  # six events due make a full segment
    run = await scheduled_run(app)
    assert run is not None and run.events == 6
    await _old_traces(app, n=1)  # two more, 40 days old: a day overdue
    app.clock.advance(-8 * DAY_S)  # 32 days old now
    run = await scheduled_run(app)
    assert run is not None and run.events == 2
