"""The log in one SQLite file (`SqliteEventLog`): one writer connection, readers on their own connections.

Appends are transactions under `BEGIN IMMEDIATE` that take `MAX(seq)+1` inside the transaction, so several
processes (the daemon and a CLI command) can append safely; the insert trigger makes the log gap-free.
`append` is the durable path (returns after COMMIT, with `synchronous=FULL`); the group-commit writer in
`writer.py` batches request events through `commit_pending`. Another process's commit shows in the files' stat
and SQLite's data_version. What the two stores share is `log.EventLog`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import event as sa_event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from blazar.clock import Clock, SystemClock
from blazar.diskspace import LOG_HEADROOM_BYTES, disk_full, no_space
from blazar.errors import AppendOnlyViolation, ArchiveError, LogError, SnapshotError
from blazar.events.base import Pending
from blazar.events.location import SqliteFile
from blazar.events.log import ChangeWatch, EventLog, LastMove
from blazar.events.log_sql import COLUMNS, Fetch, Rows
from blazar.events.migrate import ensure_schema
from blazar.events.segment_store import ARCHIVED_COLUMNS, ArchivedRange, SegmentStore

_INSERT = f"INSERT INTO events ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
# A batch this small goes in as one statement (9 parameters a row, under SQLite's 32766), which is a transaction
# of its own: one round trip to the driver's thread instead of four (BEGIN, MAX, insert, COMMIT).
ONE_STATEMENT_ROWS = 3000
# Page cache of the writer connection, in KiB (SQLite's default is 2 MiB).
WRITER_CACHE_KIB = 64 * 1024


def _engine(db: Path, *, immediate: bool) -> AsyncEngine:
    # NullPool: each reader opens its own connection (cheap for SQLite) and never shares one across tasks.
    engine = create_async_engine(f"sqlite+aiosqlite:///{db}", poolclass=NullPool)

    @sa_event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take over transaction control from the driver so BEGIN is ours to choose.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA busy_timeout=10000")
        if immediate:
            # Request events have random trace ids, so each append lands on random pages of the stream and
            # trace indexes; with SQLite's default 2 MiB cache a large log re-reads them on every batch.
            # The cache fills only as pages are touched (a CLI command that appends one event stays small).
            cur.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
        cur.close()

    @sa_event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


async def _insert_one_statement(driver: Any, encoded: Sequence[tuple[Pending, str]]) -> int:
    """Insert the batch in one statement that numbers the rows from MAX(seq) itself (the sort makes SQLite read
    MAX before the first insert); returns the seq before the first row."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(encoded))
    params: list[Any] = []
    for i, (p, data) in enumerate(encoded):
        params += (i + 1, p.ts, p.event.TYPE, p.event.V, p.stream, p.trace_id, p.actor, p.cause, data)
    sql = (f"INSERT INTO events ({COLUMNS}) SELECT base.s + r.column1, r.column2, r.column3, r.column4, r.column5,"
           " r.column6, r.column7, r.column8, r.column9"
           f" FROM (SELECT COALESCE(MAX(seq), 0) AS s FROM events) AS base, (VALUES {values}) AS r"
           " ORDER BY r.column1 RETURNING seq")
    seqs = await driver.execute_fetchall(sql, params)
    return int(min(row[0] for row in seqs)) - 1


async def _insert_in_transaction(driver: Any, encoded: Sequence[tuple[Pending, str]]) -> int:
    """A batch too large for one statement: the rows inserted under BEGIN IMMEDIATE, numbered from MAX(seq)."""
    await driver.execute("BEGIN IMMEDIATE")
    try:
        first = int((await driver.execute_fetchall("SELECT COALESCE(MAX(seq), 0) FROM events"))[0][0])
        rows = [(first + i + 1, p.ts, p.event.TYPE, p.event.V, p.stream, p.trace_id, p.actor, p.cause, data)
                for i, (p, data) in enumerate(encoded)]
        await driver.executemany(_INSERT, rows)
        await driver.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            await driver.execute("ROLLBACK")
        raise
    return first


class SqliteEventLog(EventLog):
    """The log in a SQLite file. Open with `await SqliteEventLog.open(path)`; close with `await log.close()`."""

    backend = "sqlite"

    def __init__(self, path: Path, writer: AsyncEngine, reader: AsyncEngine, clock: Clock) -> None:
        super().__init__(SqliteFile(path), clock)
        self.path = path
        self._writer_engine = writer
        self._reader_engine = reader
        self._wconn: AsyncConnection | None = None
        self._write_lock = asyncio.Lock()
        self._data_version: int | None = None  # the writer connection's PRAGMA data_version, last read
        self._driver_conn: Any = None  # the writer's aiosqlite connection, under SQLAlchemy's
        self._file_names = (str(path), str(path) + "-wal")  # what change_signature stats, 4 times a second idle
        self._lookup: AsyncConnection | None = None  # a reader kept open for has_trace (opened on first use)
        self._lookup_lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path, *, clock: Clock | None = None, migrate: bool = True,
                   archive: Path | None = None) -> SqliteEventLog:
        """`archive`: the directory of its archive segments (default: `archive/` beside the file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        log = cls(path, _engine(path, immediate=True), _engine(path, immediate=False), clock or SystemClock())
        log.archive = SegmentStore(archive or path.parent / "archive")
        try:
            if migrate:
                await asyncio.to_thread(ensure_schema, path)
            log._wconn = await log._writer_engine.connect()
            log._last_seq = await log.last_seq()
        except Exception as exc:
            await log.close()
            # A full disk fails even the open (SQLite cannot create the WAL's shared-memory index): say so.
            full = log._no_space(exc)
            if full is None:
                raise
            raise full from exc
        return log

    def _no_space(self, exc: BaseException) -> BaseException | None:
        """The DiskFull that `exc` means when no space caused it (None otherwise)."""
        if no_space(exc, self.path.parent):
            return disk_full(self.path.parent, writing=f"the event log {self.path}")
        return None

    async def close(self) -> None:
        if self._lookup is not None:
            await self._lookup.close()
            self._lookup = None
        if self._wconn is not None:
            await self._wconn.close()
            self._wconn = None
            self._driver_conn = None
        await self._writer_engine.dispose()
        await self._reader_engine.dispose()

    # -- writing -------------------------------------------------------------------------------------------

    async def _insert(self, encoded: Sequence[tuple[Pending, str]]) -> int:
        assert self._wconn is not None, "log is closed"
        async with self._write_lock:
            # NOTE: on the driver connection itself, as reads are: SQLAlchemy's statement machinery cost more CPU
            # than the insert (a group commit is on every request's path).
            driver = await self._driver()
            try:
                if len(encoded) <= ONE_STATEMENT_ROWS:
                    return await _insert_one_statement(driver, encoded)
                return await _insert_in_transaction(driver, encoded)
            except sqlite3.IntegrityError as exc:
                raise AppendOnlyViolation(f"append refused by the log: {exc}") from exc
            except sqlite3.OperationalError as exc:
                raise self._no_space(exc) or LogError(f"append failed: {exc}") from exc

    async def _insert_archived(self, pending: Pending, data: str, rng: ArchivedRange, types: Sequence[str]) -> int:
        assert self._wconn is not None, "log is closed"
        p = pending
        async with self._write_lock:
            driver = await self._driver()
            try:
                await driver.execute("BEGIN IMMEDIATE")
                try:
                    seq = int((await driver.execute_fetchall("SELECT COALESCE(MAX(seq), 0) FROM events"))[0][0]) + 1
                    await driver.execute(_INSERT, (seq, p.ts, p.event.TYPE, p.event.V, p.stream, p.trace_id,
                                                   p.actor, p.cause, data))
                    await driver.execute(
                        f"INSERT INTO archived ({ARCHIVED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (rng.segment, rng.name, rng.first_seq, rng.last_seq, rng.count, rng.sha256, seq))
                    marks = ", ".join("?" * len(types))
                    cur = await driver.execute(
                        f"DELETE FROM events WHERE seq BETWEEN ? AND ? AND type IN ({marks})",
                        (rng.first_seq, rng.last_seq, *types))
                    if cur.rowcount != rng.count:
                        raise ArchiveError(
                            f"segment {rng.name} holds {rng.count} events but the live log has {cur.rowcount} "
                            f"archivable events in seq {rng.first_seq}..{rng.last_seq}: nothing removed")
                    await driver.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        await driver.execute("ROLLBACK")
                    raise
            except sqlite3.IntegrityError as exc:
                raise AppendOnlyViolation(f"archiving refused by the log: {exc}") from exc
            except sqlite3.OperationalError as exc:
                raise self._no_space(exc) or LogError(f"archiving failed: {exc}") from exc
            return seq

    async def _driver(self) -> Any:
        """The writer's aiosqlite connection (the same one SQLAlchemy holds), looked up once."""
        if self._driver_conn is None:
            assert self._wconn is not None, "log is closed"
            self._driver_conn = (await self._wconn.get_raw_connection()).driver_connection
            assert self._driver_conn is not None  # None only once the pool has invalidated the connection
        return self._driver_conn

    async def _execute_write(self, sql: str, rows: Sequence[Sequence[Any]] | None = None) -> None:
        async with self.write_transaction() as conn:
            if rows is None:
                await conn.exec_driver_sql(sql)
            else:
                await conn.exec_driver_sql(sql, [tuple(r) for r in rows])

    @contextlib.asynccontextmanager
    async def write_transaction(self) -> AsyncIterator[AsyncConnection]:
        """The writer connection inside `BEGIN IMMEDIATE`, for derived tables (checkpoints); never `events`."""
        assert self._wconn is not None, "log is closed"
        async with self._write_lock:
            try:
                async with self._wconn.begin():
                    yield self._wconn
            except Exception as exc:
                full = self._no_space(exc)
                if full is None:
                    raise
                raise full from exc

    # -- other processes' commits ----------------------------------------------------------------------------

    async def changed_elsewhere(self) -> bool:
        """Whether another connection (another process) committed since the last call: SQLite's data_version on
        the writer connection moves for every commit but its own."""
        version = await self._read_data_version()
        changed = self._data_version is not None and version != self._data_version
        first = self._data_version is None
        self._data_version = version
        return changed or first

    async def _read_data_version(self) -> int:
        """The writer connection's PRAGMA data_version: it moves for every commit but this connection's own."""
        assert self._wconn is not None, "log is closed"
        async with self._write_lock:
            rows = await (await self._driver()).execute_fetchall("PRAGMA data_version")
        return int(next(iter(rows))[0])

    def change_signature(self) -> tuple[tuple[int, int], ...]:
        """(mtime_ns, size) of the database and its WAL: any commit, by any process, changes one of them."""
        out = []
        for path in self._file_names:
            try:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, -1))
        return tuple(out)

    async def _watch(self) -> ChangeWatch:
        return _FileWatch(self, await self._read_data_version())

    # -- reading -------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[AsyncConnection]:
        async with self._reader_engine.connect() as conn:
            yield conn

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        async with self.reader() as conn:
            return [tuple(r) for r in (await conn.exec_driver_sql(sql, tuple(params))).all()]

    @contextlib.asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[Fetch]:
        async with self.reader() as conn, conn.begin():
            # One read transaction, so every batch comes from the same snapshot of the log. Batches are fetched
            # on the driver connection itself: plain tuples, without SQLAlchemy's per-row Row objects (about a
            # tenth of replay time in bench/log.py).
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None  # None only once the pool has invalidated the connection

            async def fetch(sql: str, params: Sequence[Any]) -> Rows:
                return list(await driver.execute_fetchall(sql, params))

            yield fetch

    async def _has_live_trace(self, trace_id: str) -> bool:
        """Whether any event carries `trace_id`: one look-up in the trace index, on a reader connection kept open for
        it (opening a connection costs ten times the query). Never the writer's: a busy writer does not delay it.

        NOTE: statements go straight to the driver connection, whose isolation_level is None, so each runs in a
        read transaction of its own: the kept connection never holds a snapshot that would pin the WAL."""
        async with self._lookup_lock:
            if self._lookup is None:
                self._lookup = await self._reader_engine.connect()
            driver = (await self._lookup.get_raw_connection()).driver_connection
            assert driver is not None  # None only once the pool has invalidated the connection
            rows = await driver.execute_fetchall("SELECT 1 FROM events WHERE trace_id = ? LIMIT 1", (trace_id,))
        return bool(rows)

    # -- whole logs (snapshots) ------------------------------------------------------------------------------

    def snapshot_bytes(self) -> int:
        """At most the database and its WAL."""
        found = 0
        for name in self._file_names:
            with contextlib.suppress(OSError):
                found += os.stat(name).st_size
        return found

    async def snapshot_into(self, target: Path) -> None:
        """`VACUUM INTO`, which runs inside one read transaction: a consistent copy while others append."""
        await asyncio.to_thread(self._vacuum_into, target)

    def _vacuum_into(self, target: Path) -> None:
        conn = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro", uri=True, isolation_level=None, timeout=30)
        try:
            conn.execute("VACUUM INTO ?", (str(target),))
        except sqlite3.Error as exc:
            if no_space(exc, target.parent):
                raise disk_full(target.parent, writing=f"a copy of the log at {target}",
                                needed_bytes=self.snapshot_bytes() + LOG_HEADROOM_BYTES) from exc
            raise SnapshotError(f"cannot copy {self.path}: {exc}") from None
        finally:
            conn.close()


class _FileWatch(ChangeWatch):
    """Another process's commit, seen by a tail: the files' signature moved since the last look, and the writer
    connection's data_version says the change was not its own. An idle tail costs the stat of two files a poll.

    A tail that marked and read as a commit's frames reached the disk holds the new signature and not the event, so
    the last move is asked about once more (`LastMove`) rather than trusted."""

    def __init__(self, log: SqliteEventLog, version: int) -> None:
        self._log = log
        self._version = version
        self._seen = log.change_signature()
        self._last_move = LastMove()

    def mark(self) -> None:
        signature = self._log.change_signature()
        if signature != self._seen:  # whatever moved it may not be in the read that follows: ask again later
            self._seen = signature
            self._last_move.moved(asyncio.get_running_loop().time())

    async def wait(self, own_commit: asyncio.Event, poll_interval: float) -> bool:
        own_commit.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(poll_interval):
                await own_commit.wait()
        if own_commit.is_set():
            return False
        now = asyncio.get_running_loop().time()
        signature = self._log.change_signature()
        if signature != self._seen:
            self._seen = signature
            self._last_move.moved(now)
        elif not self._last_move.recheck_due(now):
            return False
        version = await self._log._read_data_version()
        if version != self._version:  # another connection committed: read it
            self._version = version
            return True
        return False
        signature = self._log.change_signature()
        if signature != self._seen:
            self._seen = signature
            now = await self._log._read_data_version()
            if now != self._version:  # another connection committed: read it
                self._version = now
                return True
        return False
