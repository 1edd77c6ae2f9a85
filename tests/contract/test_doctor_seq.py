"""`blazar doctor`'s `log.seq` on each store once request history is archived: the live log's gaps that the
`archived` ranges explain are whole history, and an event deleted behind the triggers' back is still caught, inside
an archived range or outside one."""

from __future__ import annotations

import time

import pytest

from blazar.clock import FakeClock
from blazar.events.location import PostgresUrl
from blazar.events.log import EventLog
from blazar.operations.archive import archive
from blazar.operations.doctor import logdb, logdb_pg
from blazar.operations.doctor.report import Check
from tests.contract.backends import Backend
from tests.contract.seeded import T0, seed


async def _seq(backend: Backend) -> Check:
    now = time.time()
    if backend.name == "sqlite":
        found = logdb.log_checks(backend.paths.db, now=now)
    else:
        found = await logdb_pg.log_checks(PostgresUrl.parse(backend.location), now=now)
    return {c.name: c for c in found}["seq"]


async def _delete_behind_the_triggers(log: EventLog, backend: Backend, seq: int) -> None:
    drop = "DROP TRIGGER events_no_delete" + (" ON events" if backend.name == "postgresql" else "")
    await log._execute_write(drop)
    await log._execute_write(f"DELETE FROM events WHERE seq = {seq}")


@pytest.fixture
async def archived(event_log: EventLog, clock: FakeClock) -> EventLog:
    """The nine events of the reads suite; seqs 3 and 4 (request.received) archived in range 1..6, seq 10 records it."""
    await seed(event_log, clock)
    run = await archive(event_log, cutoff=T0 + 50, now=T0 + 100)
    assert [(s.first_seq, s.last_seq, s.count) for s in run.segments] == [(1, 6, 2)]
    return event_log


async def test_gaps_the_archived_ranges_explain_are_whole(backend: Backend, archived: EventLog) -> None:
    check = await _seq(backend)
    assert check.status == "ok", check
    assert "seq 1..10 whole: 8 live events and 2 archived in 1 segment(s)" in check.observation


async def test_a_control_event_deleted_inside_an_archived_range_fails(backend: Backend, archived: EventLog) -> None:
    await _delete_behind_the_triggers(archived, backend, 5)  # model.aliased: never archived
    check = await _seq(backend)
    assert check.status == "fail" and "inside the archived ranges 3 seq number(s) are missing" in check.observation
    assert "account for 2" in check.observation and "blazar restore" in (check.fix or "")


async def test_an_event_deleted_outside_every_archived_range_is_named(backend: Backend, archived: EventLog) -> None:
    await _delete_behind_the_triggers(archived, backend, 8)
    check = await _seq(backend)
    assert check.status == "fail" and "seq 8 is missing and no archived range holds it" in check.observation


async def test_a_log_never_archived_keeps_its_plain_verdicts(backend: Backend, event_log: EventLog,
                                                            clock: FakeClock) -> None:
    await seed(event_log, clock)
    assert (await _seq(backend)).observation == "seq 1..9 without gaps (9 events)"
    await _delete_behind_the_triggers(event_log, backend, 1)
    check = await _seq(backend)
    assert check.status == "fail" and "seq 1 is missing" in check.observation
