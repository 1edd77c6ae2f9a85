"""The log: durable appends, gap-free seqs, append-only triggers, filtered reads, live tails."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import ClassVar

import pytest

from blazar.clock import FakeClock
from blazar.errors import ConfigError, EventTooLarge, MalformedEvent, UnknownEventType
from blazar.events import Event, log_sqlite, register, upcaster
from blazar.events import log as event_log_module
from blazar.events.log import EventLog
from blazar.events.log_sqlite import SqliteEventLog
from blazar.events.system import ConfigChanged
from blazar.events.writer import GroupCommitWriter
from tests.support.bounds import HANG_S


@register
class _Ping(Event):
    TYPE: ClassVar[str] = "test.pinged"
    CONTROL: ClassVar[bool] = False
    n: int
    model: str = "m"

    def stream_key(self) -> str:
        return f"model:{self.model}"


@register
class _Renamed(Event):
    """v2 renamed `title` (v1) to `name` and added `size_bytes`."""

    TYPE: ClassVar[str] = "test.renamed"
    V: ClassVar[int] = 2
    name: str
    size_bytes: int


@upcaster("test.renamed", 1)
def _renamed_v1_to_v2(data: dict) -> dict:
    return {"name": data["title"], "size_bytes": 0}


def _raw_insert(db, seq: int, type_name: str, v: int, data: str) -> None:
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(
            "INSERT INTO events (seq, ts, type, v, stream, trace_id, actor, cause, data) "
            "VALUES (?, 1.0, ?, ?, 'system', NULL, 'test', NULL, ?)",
            (seq, type_name, v, data),
        )
    conn.close()


async def test_append_assigns_consecutive_seqs_and_envelope(log: EventLog, clock: FakeClock) -> None:
    first = await log.append(_Ping(n=1), actor="cli:alice", trace_id="t1")
    clock.advance(2.5)
    more = await log.append([_Ping(n=2), _Ping(n=3, model="x")], actor="daemon", cause=first[0].seq)
    assert [r.seq for r in first + more] == [1, 2, 3]
    assert more[1].stream == "model:x" and more[1].cause == 1 and more[0].ts == first[0].ts + 2.5
    got = [r async for r in log.read()]
    assert [(r.seq, r.event) for r in got] == [(1, _Ping(n=1)), (2, _Ping(n=2)), (3, _Ping(n=3, model="x"))]
    assert got[0].trace_id == "t1" and got[0].actor == "cli:alice"


async def test_update_and_delete_are_refused_by_triggers(log: EventLog) -> None:
    await log.append(_Ping(n=1), actor="t")
    conn = sqlite3.connect(log.path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE events SET data = '{}' WHERE seq = 1")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM events")
    conn.close()
    assert [r.event for r in [r async for r in log.read()]] == [_Ping(n=1)]


async def test_insert_out_of_line_seq_is_refused(log: EventLog) -> None:
    await log.append(_Ping(n=1), actor="t")
    with pytest.raises(sqlite3.IntegrityError, match="gap-free"):
        _raw_insert(log.path, 5, "test.pinged", 1, '{"n": 5}')
    with pytest.raises(sqlite3.IntegrityError):
        _raw_insert(log.path, 1, "test.pinged", 1, '{"n": 1}')
    assert await log.last_seq() == 1


async def test_two_logs_on_one_file_interleave_without_gaps(paths, clock) -> None:
    a = await SqliteEventLog.open(paths.db, clock=clock)
    b = await SqliteEventLog.open(paths.db, clock=clock)
    try:
        await asyncio.gather(*(lg.append(_Ping(n=i), actor="t") for i in range(20) for lg in (a, b)))
        seqs = [r.seq async for r in a.read()]
        assert seqs == list(range(1, 41))
    finally:
        await a.close()
        await b.close()


async def test_old_version_payload_is_upcast_on_read(log: EventLog) -> None:
    _raw_insert(log.path, 1, "test.renamed", 1, '{"title": "gemma"}')
    (rec,) = [r async for r in log.read()]
    assert rec.event == _Renamed(name="gemma", size_bytes=0)
    assert rec.v == 1  # the stored row is never rewritten
    conn = sqlite3.connect(log.path)
    assert conn.execute("SELECT v, data FROM events").fetchone() == (1, '{"title": "gemma"}')
    conn.close()


async def test_unknown_type_on_read_names_the_seq(log: EventLog) -> None:
    await log.append(_Ping(n=1), actor="t")
    _raw_insert(log.path, 2, "test.never_registered", 1, "{}")
    with pytest.raises(UnknownEventType, match=r"seq 2: unknown event type 'test.never_registered'"):
        _ = [r async for r in log.read()]


async def test_malformed_payload_on_read_names_the_seq(log: EventLog) -> None:
    _raw_insert(log.path, 1, "test.pinged", 1, '{"n": "not a number"}')
    _raw_insert(log.path, 2, "test.pinged", 1, "{not json")
    with pytest.raises(MalformedEvent, match=r"seq 1: malformed 'test.pinged' payload: n:"):
        _ = [r async for r in log.read(upto=1)]
    with pytest.raises(MalformedEvent, match="seq 2"):
        _ = [r async for r in log.read(after=1)]


async def test_newer_version_than_code_is_a_clear_error(log: EventLog) -> None:
    _raw_insert(log.path, 1, "test.pinged", 9, '{"n": 1}')
    with pytest.raises(MalformedEvent, match="version 9 is newer"):
        _ = [r async for r in log.read()]


async def test_reads_filter_by_type_stream_trace_time_and_range(log: EventLog, clock: FakeClock) -> None:
    await log.append(_Ping(n=1, model="a"), actor="t", trace_id="tr1")
    clock.advance(10)
    await log.append(ConfigChanged(key="log_level", new="info"), actor="t")
    clock.advance(10)
    await log.append(_Ping(n=2, model="b"), actor="t", trace_id="tr2")
    t0 = clock.now() - 20

    async def seqs(**kw) -> list[int]:
        return [r.seq async for r in log.read(**kw)]

    assert await seqs(types=["test.pinged"]) == [1, 3]
    assert await seqs(stream="model:b") == [3]
    assert await seqs(trace_id="tr1") == [1]
    assert await seqs(since=t0 + 5) == [2, 3]
    assert await seqs(until=t0 + 15) == [1, 2]
    assert await seqs(after=1, upto=2) == [2]
    assert await seqs(limit=2) == [1, 2]
    assert await seqs(batch=1) == [1, 2, 3]
    assert await log.seq_at_time(t0 + 10) == 2


async def test_follow_yields_existing_then_new_events(log: EventLog) -> None:
    await log.append(_Ping(n=1), actor="t")
    seen: list[int] = []

    async def tail() -> None:
        async for rec in log.follow(poll_interval=0.05):
            seen.append(rec.seq)
            if len(seen) == 3:
                return

    task = asyncio.create_task(tail())
    await asyncio.sleep(0.05)
    await log.append(_Ping(n=2), actor="t")
    await log.append(_Ping(n=3), actor="t")
    await asyncio.wait_for(task, HANG_S)
    assert seen == [1, 2, 3]


async def test_follow_sees_appends_from_another_process_connection(paths, clock) -> None:
    a = await SqliteEventLog.open(paths.db, clock=clock)
    b = await SqliteEventLog.open(paths.db, clock=clock)
    try:
        got: list[int] = []

        async def tail() -> None:
            async for rec in a.follow(poll_interval=0.02):
                got.append(rec.seq)
                return

        task = asyncio.create_task(tail())
        await asyncio.sleep(0.05)
        await b.append(_Ping(n=1), actor="other")
        await asyncio.wait_for(task, HANG_S)
        assert got == [1]
    finally:
        await a.close()
        await b.close()


async def test_group_commit_batches_and_flush_makes_events_durable(log: EventLog) -> None:
    writer = GroupCommitWriter(log, interval=0.01, max_batch=100)
    writer.start()
    for i in range(250):
        writer.submit(_Ping(n=i), actor="daemon", trace_id=f"t{i}")
    assert writer.pending_count == 250  # submit never awaits: nothing can have been committed yet
    await writer.flush()
    assert writer.committed == 250 and writer.batches >= 3
    assert [r.event.n async for r in log.read()] == list(range(250))
    await writer.stop()


async def test_group_commit_stop_drains_the_buffer(log: EventLog) -> None:
    writer = GroupCommitWriter(log, interval=10.0)
    writer.start()
    for i in range(5):
        writer.submit(_Ping(n=i), actor="daemon")
    await writer.stop()
    assert await log.last_seq() == 5


async def test_group_commit_counts_drops_when_the_buffer_is_full(log: EventLog) -> None:
    writer = GroupCommitWriter(log, max_pending=3)  # not started: nothing drains
    for i in range(5):
        writer.submit(_Ping(n=i), actor="daemon")
    assert writer.pending_count == 3 and writer.dropped == 2
    await writer.flush()
    assert await log.last_seq() == 3


async def test_group_commit_retries_a_failed_batch(log: EventLog, monkeypatch) -> None:
    from blazar.errors import LogError

    real = log.commit_pending
    calls = {"n": 0}

    async def flaky(batch):
        calls["n"] += 1
        if calls["n"] == 1:
            raise LogError("disk full (injected)")
        return await real(batch)

    monkeypatch.setattr(log, "commit_pending", flaky)
    writer = GroupCommitWriter(log, interval=0.001)
    writer.start()
    writer.submit(_Ping(n=1), actor="daemon")
    await asyncio.wait_for(writer.flush(), HANG_S)
    await writer.stop()
    assert writer.failures == 1 and await log.last_seq() == 1


@register
class _Told(Event):
    """An event carrying a string of any length: what a client-supplied field reaching an event unbounded would be."""

    TYPE: ClassVar[str] = "test.told"
    CONTROL: ClassVar[bool] = False
    text: str


async def test_an_event_over_the_bound_is_refused_where_it_is_appended_and_nothing_is_written(log: EventLog) -> None:
    log.max_event_bytes = 1024
    await log.append(_Told(text="x" * 900), actor="daemon")
    with pytest.raises(EventTooLarge) as e:
        await log.append([_Ping(n=1), _Told(text="é" * 600)], actor="daemon")  # 1,200 bytes in 600 characters
    assert e.value.type_name == "test.told" and e.value.size > 1024 and e.value.limit == 1024
    assert "event_max_kib" in e.value.message
    assert await log.last_seq() == 1  # all or nothing: the batch's other event is not written either


async def test_the_writer_refuses_an_event_over_the_bound_at_submit_and_commits_the_others(log: EventLog) -> None:
    log.max_event_bytes = 1024
    writer = GroupCommitWriter(log, interval=10.0)
    writer.start()
    writer.submit(_Ping(n=1), actor="daemon")
    with pytest.raises(EventTooLarge):
        writer.submit(_Told(text="x" * 2000), actor="daemon")  # raised to the code that built it
    writer.submit(_Ping(n=2), actor="daemon")
    await writer.stop()
    assert [r.event.n async for r in log.read()] == [1, 2]
    assert writer.failures == 0


async def test_the_bound_is_event_max_kib_read_at_start(paths, clock) -> None:  # type: ignore[no-untyped-def]
    from blazar.bootstrap import bootstrap
    from blazar.operations.config import set_value

    app = await bootstrap(paths=paths, clock=clock, actor="test")
    try:
        assert app.log.max_event_bytes == 64 << 10
        with pytest.raises(ConfigError):  # below what the largest legal payloads need (test_event_size.py)
            await set_value(app, "log.event_max_kib", "32")
        await set_value(app, "log.event_max_kib", "128")
    finally:
        await app.close()
    app = await bootstrap(paths=paths, clock=clock, actor="test")
    try:
        assert app.log.max_event_bytes == 128 << 10
        with pytest.raises(EventTooLarge):
            await app.log.append(_Told(text="x" * (129 << 10)), actor="test")
    finally:
        await app.close()


class _Files:
    """What a tail's watch reads of a SQLite log: its files' signature and data_version, set by the test."""

    def __init__(self) -> None:
        self.signature, self.version, self.asked = ((1, 1),), 0, 0

    def change_signature(self) -> tuple[tuple[int, int], ...]:
        return self.signature

    async def _read_data_version(self) -> int:
        self.asked += 1
        return self.version


async def test_a_commit_on_disk_before_readers_can_see_it_is_asked_about_again(monkeypatch) -> None:
    # The follow flake (test_follow_sees_appends_from_another_process_connection timed out under load): another
    # process's WAL frames move the signature a moment before its commit can be read; a tail that marked and read
    # in that moment held the new signature without the event, and no later stat moved again.
    monkeypatch.setattr(event_log_module, "RECHECK_S", 0.0)
    files = _Files()
    watch = log_sqlite._FileWatch(files, version=0)  # type: ignore[arg-type]
    files.signature = ((2, 2),)  # the frames are written
    watch.mark()  # the tail reads now, before the commit is visible: it reads nothing
    files.version = 1  # the commit is visible; nothing on disk moves again
    assert await watch.wait(asyncio.Event(), 0.001) is True
    assert await watch.wait(asyncio.Event(), 0.001) is False  # asked once more, not forever


async def test_an_idle_tail_asks_the_database_nothing() -> None:
    files = _Files()
    watch = log_sqlite._FileWatch(files, version=0)  # type: ignore[arg-type]
    watch.mark()
    for _ in range(5):
        assert await watch.wait(asyncio.Event(), 0.001) is False
    assert files.asked == 0
