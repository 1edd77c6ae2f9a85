"""Reading: every filter of `EventLog.read` and `read_rows` (seq range, type, stream, trace id, time, limit), batch
boundaries, one snapshot per read, and an envelope that comes back exactly as it went in."""

from __future__ import annotations

from typing import Any

import pytest

from blazar.clock import FakeClock
from blazar.events.base import Recorded
from blazar.events.log import EventLog
from blazar.events.log_sql import row_to_recorded
from blazar.events.requests import RequestReceived
from tests.contract.seeded import CASES, T0, seed, seqs
from tests.contract.workload import aliased, received


@pytest.fixture
async def seeded(event_log: EventLog, clock: FakeClock) -> list[Recorded]:
    assert clock.now() == T0
    return await seed(event_log, clock)


@pytest.mark.parametrize(("filters", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_read_filters_select_exactly_the_matching_events_in_seq_order(
    event_log: EventLog, seeded: list[Recorded], filters: dict[str, Any], expected: list[int]
) -> None:
    assert await seqs(event_log, **filters) == expected
    # Batch size never changes the answer, however the batches fall.
    for batch in (1, 2, 3):
        assert await seqs(event_log, batch=batch, **filters) == expected, batch


async def test_read_returns_each_event_as_it_was_appended(event_log: EventLog, seeded: list[Recorded]) -> None:
    assert [rec async for rec in event_log.read()] == seeded
    assert [rec async for rec in event_log.read(batch=2, limit=7)] == seeded[:7]


async def test_read_rows_gives_the_same_events_undecoded_in_bounded_batches(
    event_log: EventLog, seeded: list[Recorded]
) -> None:
    batches = [rows async for rows in event_log.read_rows(batch=4)]
    assert [len(rows) for rows in batches] == [4, 4, 1]
    assert [row_to_recorded(row) for rows in batches for row in rows] == seeded
    ranged = [row[0] async for rows in event_log.read_rows(after=2, upto=7, types=[RequestReceived.TYPE], batch=1)
              for row in rows]
    assert ranged == [3, 4, 7]


async def test_last_seq_and_seq_at_time(event_log: EventLog, seeded: list[Recorded]) -> None:
    assert await event_log.last_seq() == 9
    assert await event_log.seq_at_time(T0 - 1) == 0
    assert await event_log.seq_at_time(T0) == 2
    assert await event_log.seq_at_time(T0 + 39.9) == 5
    assert await event_log.seq_at_time(T0 + 1000) == 9


async def test_a_read_sees_one_snapshot_even_when_events_land_between_its_batches(
    event_log: EventLog, second_log: EventLog, seeded: list[Recorded]
) -> None:
    seen: list[int] = []
    async for rows in event_log.read_rows(batch=2):
        seen += [row[0] for row in rows]
        if len(seen) == 2:
            await second_log.append([aliased("late", i) for i in range(3)], actor="other")
    assert seen == list(range(1, 10))
    assert await seqs(event_log, after=9) == [10, 11, 12]


async def test_an_empty_log_reads_as_empty(event_log: EventLog) -> None:
    assert await seqs(event_log) == []
    assert [rows async for rows in event_log.read_rows()] == []
    assert await event_log.last_seq() == 0


@pytest.mark.parametrize("ts", [0.1 + 0.2, 1_700_000_000.123456789, 1e-7, 2.0**53 + 2], ids=repr)
async def test_the_envelope_round_trips_exactly(event_log: EventLog, second_log: EventLog, ts: float) -> None:
    # Checkpoint anchors are `type@repr(ts)`: a backend that rounds a timestamp would orphan every checkpoint.
    trace = "0123456789abcdef0123456789abcdef"
    text = "naïve ☃ \"quoted\" \\ \x01 \U0001f600"
    (first,) = await event_log.commit_pending([event_log.pending(aliased("m", 0), actor="key:ops", trace_id=trace,
                                                                 ts=ts)])
    (rec,) = await event_log.commit_pending([event_log.pending(aliased(text, 1), actor=text, stream=f"model:{text}",
                                                               cause=first.seq, ts=ts)])
    (got_first, got) = [r async for r in second_log.read()]
    assert (got_first, got) == (first, rec)
    assert got.ts.hex() == ts.hex()
    assert (got.actor, got.stream, got.cause, got.trace_id) == (text, f"model:{text}", 1, None)
    assert got_first.trace_id == trace


async def test_has_trace_finds_any_trace_id_the_log_holds_and_nothing_else(
        event_log: EventLog, second_log: EventLog, seeded: list[Recorded]) -> None:
    assert await event_log.has_trace("t1-0000") and await event_log.has_trace("t2-0000")
    assert not await event_log.has_trace("t1-000")  # a prefix is not the trace
    assert not await event_log.has_trace("nope")
    # Another writer's later commit is seen by the connection kept open for these look-ups.
    await second_log.append(received("t3", 0), actor="gateway", trace_id="t3-0000")
    assert await event_log.has_trace("t3-0000")
