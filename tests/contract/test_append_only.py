"""The database itself refuses to rewrite history: UPDATE and DELETE on `events`, and inserts that would leave a
gap or reuse a seq, fail inside the log's own write transaction, and the log is unchanged afterwards."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError

from blazar.events.log import EventLog
from tests.contract.workload import actor, aliased

# Plain SQL without parameters, so it reads the same to every backend's driver.
REWRITES = [
    ("UPDATE events SET data = '{}' WHERE seq = 1", "append-only"),
    ("UPDATE events SET seq = seq", "append-only"),
    ("UPDATE events SET actor = 'mallory'", "append-only"),
    ("DELETE FROM events WHERE seq = 2", "append-only"),
    ("DELETE FROM events", "append-only"),
]


def _insert(seq: int) -> str:
    return (
        "INSERT INTO events (seq, ts, type, v, stream, trace_id, actor, cause, data) VALUES "
        f"({seq}, 1.0, 'model.aliased', 1, 'model:x', NULL, 'mallory', NULL, "
        "'{\"alias\": \"x\", \"target\": \"x\"}')"
    )


async def _rows(log: EventLog) -> list[tuple]:
    return [row async for rows in log.read_rows() for row in rows]


async def _execute(log: EventLog, sql: str) -> None:
    async with log.write_transaction() as conn:
        await conn.exec_driver_sql(sql)


@pytest.mark.parametrize(("sql", "message"), REWRITES, ids=[sql for sql, _ in REWRITES])
async def test_update_and_delete_on_events_are_refused_by_the_database(
    event_log: EventLog, sql: str, message: str
) -> None:
    await event_log.append([aliased("a", i) for i in range(3)], actor=actor("a"))
    before = await _rows(event_log)
    with pytest.raises(DBAPIError, match=message):
        await _execute(event_log, sql)
    assert await _rows(event_log) == before
    # The refusal rolled back cleanly: the writer connection appends on, from the next seq.
    (rec,) = await event_log.append(aliased("a", 3), actor=actor("a"))
    assert rec.seq == 4


@pytest.mark.parametrize("seq", [1, 3, 5], ids=["reused", "last reused", "gap"])
async def test_an_insert_that_reuses_a_seq_or_leaves_a_gap_is_refused(event_log: EventLog, seq: int) -> None:
    await event_log.append([aliased("a", i) for i in range(3)], actor=actor("a"))
    before = await _rows(event_log)
    with pytest.raises(DBAPIError):
        await _execute(event_log, _insert(seq))
    assert await _rows(event_log) == before


async def test_an_insert_at_the_next_seq_is_the_only_one_accepted(event_log: EventLog) -> None:
    await event_log.append(aliased("a", 0), actor=actor("a"))
    await _execute(event_log, _insert(2))
    assert [r.seq async for r in event_log.read()] == [1, 2]
    assert await event_log.last_seq() == 2
