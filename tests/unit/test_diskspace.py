"""Telling a full disk from the other ways a write fails (blazar/diskspace.py), the writer that holds what it cannot
write (blazar/events/writer.py) and /ready's reading of it (blazar/queries/log_writer.py). The real full disk is in
tests/integration/test_disk_full.py; here the failures are injected or made by SQLite itself."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
from pathlib import Path
from typing import ClassVar

import pytest

from blazar import diskspace
from blazar.diskspace import disk_full, explain, no_space, space
from blazar.errors import DiskFull, LogError
from blazar.events.base import Event
from blazar.events.log import EventLog
from blazar.events.types import register
from blazar.events.writer import GroupCommitWriter
from blazar.operations.doctor.checks import disk_full as doctor_disk_full
from blazar.operations.doctor.checks import not_opened, safe_to_open
from blazar.operations.doctor.report import Check
from blazar.queries.log_writer import writer_check


@register
class _Tick(Event):
    TYPE: ClassVar[str] = "test.disk_ticked"
    CONTROL: ClassVar[bool] = False
    n: int

    def stream_key(self) -> str:
        return "test"


def _sqlite_full(tmp_path: Path) -> sqlite3.Error:
    """SQLite's own SQLITE_FULL: a database that may not grow past two pages."""
    conn = sqlite3.connect(tmp_path / "capped.db")
    conn.execute("CREATE TABLE t (x BLOB)")
    conn.execute("PRAGMA max_page_count = 2")
    try:
        with pytest.raises(sqlite3.OperationalError) as caught:
            conn.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))
    finally:
        conn.close()
    return caught.value


def test_enospc_and_sqlite_full_are_no_space_and_other_failures_are_not(tmp_path: Path) -> None:
    assert no_space(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert no_space(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path)
    assert no_space(_sqlite_full(tmp_path), tmp_path)
    assert not no_space(OSError(errno.EACCES, "Permission denied"), tmp_path)
    assert not no_space(ValueError("no"), tmp_path)


def test_an_sqlite_io_error_is_no_space_only_on_a_disk_without_room(tmp_path: Path, monkeypatch) -> None:
    ioerr = sqlite3.OperationalError("disk I/O error")
    ioerr.sqlite_errorcode = 4874  # SQLITE_IOERR_SHMSIZE, what a WAL index that cannot grow reports
    assert not no_space(ioerr, tmp_path)  # this disk has room: a real I/O error is not called "full"
    real = space(tmp_path)
    monkeypatch.setattr(diskspace, "space", lambda p: diskspace.Space(p, real.mount, 4096, real.total_bytes))
    assert no_space(ioerr, tmp_path)


def test_a_cause_deep_in_the_chain_is_found_and_a_failed_file_names_itself(tmp_path: Path) -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "sub" / "config.toml"))
        except OSError as inner:
            raise LogError("wrapped") from inner
    except LogError as outer:
        full = explain(outer, tmp_path, writing="something else")
    assert isinstance(full, DiskFull)
    assert full.writing == str(tmp_path / "sub" / "config.toml")
    assert explain(ValueError("x"), tmp_path, writing="w") is None


def test_the_message_names_the_disk_what_is_free_and_what_is_needed(tmp_path: Path) -> None:
    full = disk_full(tmp_path, writing="the event log", needed_bytes=16 << 20)
    s = space(tmp_path)
    assert f"on the filesystem mounted at {s.mount}" in full.message and "free of" in full.message
    assert "writing the event log needs at least 16.0 MiB free" in full.message
    assert (full.code, full.http_status, full.exit_code, full.needed_bytes) == ("disk_full", 507, 12, 16 << 20)
    assert "\n" not in full.message


async def test_the_writer_holds_what_it_cannot_write_says_why_and_loses_nothing(log: EventLog, monkeypatch) -> None:
    real = log.commit_pending
    room = asyncio.Event()

    async def disk(batch):
        if not room.is_set():
            raise disk_full(log.path.parent, writing="the event log")
        return await real(batch)

    monkeypatch.setattr(log, "commit_pending", disk)
    writer = GroupCommitWriter(log, interval=0.001, max_pending=5)
    writer.start()
    try:
        for i in range(7):
            writer.submit(_Tick(n=i), actor="daemon")
        for _ in range(200):  # the first commit fails within a few ms
            if writer.stalled:
                break
            await asyncio.sleep(0.01)
        assert writer.stalled and isinstance(writer.last_error, DiskFull)
        assert (writer.pending_count, writer.dropped) == (5, 2)  # the bound: kept 5, refused and counted 2
        check = writer_check(writer, log.path.parent, now_monotonic=log.clock.monotonic())
        assert (check["ok"], check["reason"], check["pending"], check["dropped"]) == (False, "disk_full", 5, 2)
        assert "5 request event(s) wait in memory" in check["detail"]
        room.set()
        await asyncio.wait_for(writer.flush(), 10)
        assert not writer.stalled and writer.last_error is None
        assert [r.event.n async for r in log.read()] == [0, 1, 2, 3, 4]
        assert writer_check(writer, log.path.parent, now_monotonic=0.0)["ok"] is True
    finally:
        room.set()
        await writer.stop()


async def test_stopping_while_the_disk_stays_full_gives_up_after_the_bounded_wait(log: EventLog,
                                                                                 monkeypatch) -> None:
    async def never(batch):
        raise disk_full(log.path.parent, writing="the event log")

    monkeypatch.setattr(log, "commit_pending", never)
    writer = GroupCommitWriter(log, interval=0.001, stop_wait_s=0.2)
    writer.start()
    writer.submit(_Tick(n=1), actor="daemon")
    await asyncio.wait_for(writer.stop(), 10)
    assert writer.pending_count == 0 and writer.dropped == 1 and await log.last_seq() == 0


def test_no_writer_yet_is_ready() -> None:
    assert writer_check(None, Path("/"), now_monotonic=0.0) == {"ok": True, "pending": 0, "dropped": 0}


def test_doctor_does_not_open_a_log_it_could_only_read_as_it_stands_on_a_full_disk() -> None:
    full = [Check("log", "integrity", "warn", "the disk ... is full ... the log is intact")]
    assert not safe_to_open(full) and doctor_disk_full(full)
    assert all("disk under the log is full" in c.observation for c in not_opened(disk_full=True))
    damaged = [Check("log", "integrity", "fail", "PRAGMA integrity_check found 2 problem(s)")]
    assert not safe_to_open(damaged) and not doctor_disk_full(damaged)
    assert safe_to_open([Check("log", "integrity", "ok", "ok")])
