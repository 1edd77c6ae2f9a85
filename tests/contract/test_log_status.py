"""`blazar log status`'s query over a real log (each store) with request history of several days, before and after an
archive run: sizes, counts per day and type, growth, the oldest events, what a run would move now (the same seq the
archiver stops at), and the archive's segments, a missing one and leftover files."""

from __future__ import annotations

import pytest

from blazar.clock import FakeClock
from blazar.events.log import EventLog
from blazar.events.log_sqlite import SqliteEventLog
from blazar.events.models import ModelAliased
from blazar.events.requests import RequestCompleted, RequestReceived
from blazar.operations.archive import archive, cutoff_seq
from blazar.queries.log_status import DAY_S, Retention, log_status
from tests.contract.backends import Backend

T0 = 1_700_006_400.0  # 2023-11-15 00:00 UTC
THIRTY_DAYS = Retention(request_retention="30d", retention_s=30 * DAY_S, archive_every_s=3600.0)
KEEP_ALL = Retention(request_retention="0", retention_s=0.0, archive_every_s=3600.0)


async def _trace(log: EventLog, trace_id: str) -> None:
    await log.append(RequestReceived(trace_id=trace_id, dialect="openai", route="/v1/chat/completions", model="m"),
                     actor="gateway", trace_id=trace_id)
    await log.append(RequestCompleted(trace_id=trace_id, model="m", duration_ms=5.0), actor="gateway",
                     trace_id=trace_id)


@pytest.fixture
async def seeded(event_log: EventLog, clock: FakeClock) -> EventLog:
    """Day 0: two control events and three traces; day 1: two traces; day 41: one trace (now is day 41, noon)."""
    log = event_log
    clock.advance(T0 + 3600 - clock.now())
    await log.append([ModelAliased(alias="a", target="m"), ModelAliased(alias="b", target="m")], actor="cli:x")
    for i in range(3):
        await _trace(log, f"old-{i}")
    clock.advance(DAY_S)
    for i in range(2):
        await _trace(log, f"day1-{i}")
    clock.advance(40 * DAY_S + 11 * 3600)
    await _trace(log, "new-0")
    return log


async def _on_disk(log: EventLog) -> int:
    """The live log's size as the store itself says it: the SQLite file and its WAL, or PostgreSQL's own count."""
    if isinstance(log, SqliteEventLog):
        wal = log.path.with_name(log.path.name + "-wal")
        return log.path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    return int((await log._fetch("SELECT pg_total_relation_size('events')"))[0][0])


async def test_status_of_a_log_never_archived(seeded: EventLog, backend: Backend) -> None:
    now = seeded.clock.now()
    info = await log_status(seeded, THIRTY_DAYS, now=now, days=60)
    live = info["live"]
    on_disk = await _on_disk(seeded)
    assert info["backend"] == backend.name
    assert live["events"] == 14 and (live["first_seq"], live["last_seq"]) == (1, 14)
    assert live["bytes"] == on_disk > 0
    assert live["oldest"] == {"seq": 1, "ts": T0 + 3600, "type": "model.aliased"}
    assert live["oldest_archivable"] == {"seq": 3, "ts": T0 + 3600, "type": "request.received"}
    assert [(d["day"], d["events"]) for d in info["days"]] == [("2023-11-15", 8), ("2023-11-16", 4),
                                                               ("2023-12-26", 2)]
    assert info["days"][0]["types"] == {"model.aliased": 2, "request.completed": 3, "request.received": 3}
    assert info["types"]["request.received"] == {"live": 6, "archived": 0}
    # Only the newest day falls in the last `days` days asked for.
    assert [d["day"] for d in (await log_status(seeded, THIRTY_DAYS, now=now, days=3))["days"]] == ["2023-12-26"]
    # Growth over the last seven days: the two events of day 41.
    g = info["growth"]
    assert g["events"] == 2 and g["events_per_day"] == pytest.approx(2 / 7)
    assert g["bytes_per_day"] == pytest.approx(2 / 7 * on_disk / 14)
    ret = info["retention"]
    # The cutoff is day 11: the traces of days 0 and 1 (ten request events) would move; the run stops at seq 12.
    assert ret["cutoff"] == now - 30 * DAY_S and ret["cutoff_seq"] == 12 == await cutoff_seq(seeded, ret["cutoff"])
    assert ret["archivable_now"] == 10 and ret["last_archived_at"] is None
    assert info["archive"] == {"dir": str(backend.paths.archive), "count": 0, "events": 0, "bytes": 0,
                               "segments": [], "orphans": [], "orphan_bytes": 0}


async def test_status_after_archiving_counts_both_sides_and_lists_the_segment(seeded: EventLog) -> None:
    now = seeded.clock.now()
    before = await log_status(seeded, THIRTY_DAYS, now=now, days=60)
    run = await archive(seeded, cutoff=before["retention"]["cutoff"], now=now)
    assert run.events == before["retention"]["archivable_now"] == 10
    info = await log_status(seeded, THIRTY_DAYS, now=now, days=60)
    assert info["live"]["events"] == 14 - 10 + 1  # the log.archived event stays live
    assert info["live"]["oldest_archivable"]["seq"] == 13
    assert info["types"]["request.received"] == {"live": 1, "archived": 5}
    assert info["types"]["request.completed"] == {"live": 1, "archived": 5}
    assert info["types"]["log.archived"] == {"live": 1, "archived": 0}
    ret = info["retention"]
    assert ret["archivable_now"] == 0 and ret["last_archived_at"] == now
    arch = info["archive"]
    (seg,) = arch["segments"]
    assert (seg["name"], seg["first_seq"], seg["last_seq"], seg["count"]) == (run.segments[0].name, 1, 12, 10)
    assert seg["bytes"] == run.segments[0].bytes and not seg["missing"]
    assert (seg["ts_min"], seg["ts_max"]) == (T0 + 3600, T0 + 3600 + DAY_S)
    assert seg["types"] == {"request.completed": 5, "request.received": 5}
    assert arch["count"] == 1 and arch["events"] == 10
    store = seeded.archive
    assert store is not None
    assert arch["bytes"] == sum(p.stat().st_size for p in store.files()) > seg["bytes"]
    # A leftover file (a run that stopped before its commit) and a missing data file are both said.
    stray = store.root / "seg-000002-13-20.jsonl.gz"
    stray.write_bytes(b"x" * 7)
    store.path(seg["name"], ".jsonl.gz").unlink()
    info = await log_status(seeded, THIRTY_DAYS, now=now, days=60)
    assert info["archive"]["orphans"] == [stray.name] and info["archive"]["orphan_bytes"] == 7
    (seg,) = info["archive"]["segments"]
    assert seg["missing"] and seg["bytes"] is None


async def test_retention_zero_reports_nothing_to_archive(seeded: EventLog) -> None:
    info = await log_status(seeded, KEEP_ALL, now=seeded.clock.now())
    assert info["retention"] == {"request_retention": "0", "retention_s": 0.0, "archive_every_s": 3600.0,
                                 "cutoff": None, "cutoff_seq": None, "archivable_now": 0, "last_archived_at": None}


async def test_an_empty_log_and_a_young_one_have_no_growth_yet(event_log: EventLog, clock: FakeClock) -> None:
    now = clock.now()
    info = await log_status(event_log, THIRTY_DAYS, now=now)
    assert info["live"]["events"] == 0 and info["live"]["oldest"] is None and info["days"] == []
    assert info["growth"]["events_per_day"] is None and info["retention"]["archivable_now"] == 0
    await _trace(event_log, "t")
    young = await log_status(event_log, THIRTY_DAYS, now=now + 60)  # a minute of history says nothing about a day
    assert young["growth"]["events_per_day"] is None and young["live"]["events"] == 2
