"""The append-only log on PostgreSQL (`database_url = postgresql+asyncpg://...`): the SQLite log's sibling under
`log.EventLog`, the same contract, for several gateways sharing one history. SQLAlchemy's async engine with asyncpg
holds the connections (Alembic migrates through it); appends, reads and LISTEN run on the asyncpg driver connections
under it, as the SQLite log does on aiosqlite's, to keep SQLAlchemy's statement machinery off the request path.

    gap-free seq   every append takes one transaction-scoped advisory lock (`pg_advisory_xact_lock`), reads
                   MAX(seq) under it and numbers its rows from there: appends from every process and node serialise
                   on that lock, and the insert trigger refuses any seq but MAX(seq)+1 (the primary key any twin)
    append-only    triggers refuse UPDATE, DELETE and TRUNCATE on `events`
    follow         each append NOTIFYs `blazar_events` with its last seq in the same transaction (delivered at
                   commit); a tail LISTENs instead of polling, and reads only when another backend's commit shows
    snapshots      a REPEATABLE READ transaction reads one consistent snapshot of the whole log

What the two stores share is `log.EventLog`'s; SQL written there with `?` placeholders is numbered here (`$1`...).
asyncpg is imported only here, and this module only when a URL asks for PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from blazar.clock import Clock, SystemClock
from blazar.errors import AppendOnlyViolation, ArchiveBusy, ArchiveError, LogError, LogUnreachable
from blazar.events.base import Pending
from blazar.events.location import PostgresUrl
from blazar.events.log import ChangeWatch, EventLog
from blazar.events.log_sql import COLUMNS, INSERT_ARCHIVED, Fetch, Rows
from blazar.events.segment_store import ARCHIVED_COLUMNS, ArchivedRange
from blazar.events.snapshot_file import copy_into_file

T = TypeVar("T")
# What says the connection or the server is gone (as opposed to a statement the database refused).
_GONE = (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
         asyncpg.AdminShutdownError, ConnectionError)
# A lost LISTEN connection is tried again at most this often.
RELISTEN_S = 1.0
CHANNEL = "blazar_events"
# The one advisory lock every append takes (any 64-bit number no other tool of this database uses: "blazar").
APPEND_LOCK = 0x626C617A6172
# Off only in bench/pg_lock.py, which measures what the lock costs; never in Blazar (the trigger and the primary key
# would then turn a race between two writers into a refused append instead of a wait).
APPEND_LOCK_ENABLED = True
# Held by an archive run for its whole length ("blazarc"), so nodes with separate archive directories never race.
ARCHIVE_LOCK = 0x626C617A617263
_INSERT = (f"INSERT INTO events ({COLUMNS}) SELECT * FROM unnest($1::bigint[], $2::float8[], $3::text[], "
           "$4::int[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::text[])")
_INSERT_ONE = f"INSERT INTO events ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"


@functools.lru_cache(maxsize=256)
def numbered(sql: str) -> str:
    """`?` placeholders as PostgreSQL's `$1`, `$2`... (the shared SQL has no `?` inside a literal)."""
    parts = sql.split("?")
    return "".join(f"{part}${i}" for i, part in enumerate(parts[:-1], 1)) + parts[-1]


class PgEventLog(EventLog):
    """The log on PostgreSQL. Open with `await PgEventLog.open(url)`; close with `await log.close()`."""

    backend = "postgresql"

    def __init__(self, url: PostgresUrl, engine: AsyncEngine, clock: Clock) -> None:
        super().__init__(url, clock)
        self.url = url
        self._engine = engine
        self._wconn: AsyncConnection | None = None
        self._driver_conn: Any = None
        self._write_lock = asyncio.Lock()
        self._listen: Any = None  # an asyncpg connection of its own that LISTENs
        self._own_pid = 0
        self._elsewhere = 0  # notifications of other backends' commits seen
        self._elsewhere_checked = -1
        self._notified = asyncio.Event()
        self._closed = False
        self._relisten_at = 0.0

    @classmethod
    async def open(cls, url: PostgresUrl, *, clock: Clock | None = None, migrate: bool = True) -> PgEventLog:
        from blazar.events.migrate_pg import ensure_schema

        if migrate:
            await ensure_schema(url)
        engine = create_async_engine(url.sqlalchemy, pool_size=4, max_overflow=8, pool_pre_ping=True)
        log = cls(url, engine, clock or SystemClock())
        try:
            log._wconn = await engine.connect()
            driver = await log._driver()
            log._own_pid = driver.get_server_pid()
            await log._relisten()
            log._last_seq = await log.last_seq()
        except BaseException:
            await log.close()
            raise
        return log

    async def close(self) -> None:
        self._closed = True
        if self._listen is not None:
            with contextlib.suppress(Exception):
                await self._listen.close()
            self._listen = None
        if self._wconn is not None:
            await self._wconn.close()
            self._wconn = None
            self._driver_conn = None
        await self._engine.dispose()

    async def _relisten(self) -> bool:
        """(Re)open the LISTEN connection; False when the database cannot be reached (tried again later)."""
        self._relisten_at = asyncio.get_running_loop().time() + RELISTEN_S
        old, self._listen = self._listen, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()
        try:
            conn = await asyncpg.connect(self.url.driver)
            await conn.add_listener(CHANNEL, self._on_notify)
        except _GONE:
            return False
        self._listen = conn
        return True

    async def _listening(self) -> bool:
        """Whether notifications can arrive; a lost listener is reconnected (what it missed counts as another
        backend's commit, so the caller reads the log)."""
        if self._listen is not None and not self._listen.is_closed():
            return True
        if asyncio.get_running_loop().time() < self._relisten_at:
            return False
        if await self._relisten():
            self._elsewhere += 1  # commits may have landed while nobody listened
            self._notified.set()
            return True
        return False

    def _on_notify(self, _conn: Any, pid: int, _channel: str, _payload: str) -> None:
        if pid != self._own_pid:
            self._elsewhere += 1
        self._notified.set()

    # -- writing ---------------------------------------------------------------------------------------------

    async def _insert(self, encoded: Sequence[tuple[Pending, str]]) -> int:
        async def insert(driver: Any) -> int:
            if APPEND_LOCK_ENABLED:
                await driver.execute("SELECT pg_advisory_xact_lock($1)", APPEND_LOCK)
            first = int(await driver.fetchval("SELECT COALESCE(MAX(seq), 0) FROM events"))
            cols: list[list[Any]] = [[] for _ in range(9)]
            for i, (p, data) in enumerate(encoded):
                for col, value in zip(cols, (first + i + 1, p.ts, p.event.TYPE, p.event.V, p.stream, p.trace_id,
                                             p.actor, p.cause, data), strict=True):
                    col.append(value)
            await driver.execute(_INSERT, *cols)
            await driver.execute("SELECT pg_notify($1, $2)", CHANNEL, str(first + len(encoded)))
            return first

        try:
            return await self._write(insert)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise AppendOnlyViolation(f"append refused by the log: {exc}") from exc

    async def _insert_archived(self, pending: Pending, data: str, rng: ArchivedRange, types: Sequence[str]) -> int:
        p = pending

        async def archive(driver: Any) -> int:
            if APPEND_LOCK_ENABLED:
                await driver.execute("SELECT pg_advisory_xact_lock($1)", APPEND_LOCK)
            seq = int(await driver.fetchval("SELECT COALESCE(MAX(seq), 0) FROM events")) + 1
            await driver.execute(numbered(_INSERT_ONE), seq, p.ts, p.event.TYPE, p.event.V, p.stream, p.trace_id,
                                 p.actor, p.cause, data)
            await driver.execute(numbered(f"INSERT INTO archived ({ARCHIVED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"),
                                 rng.segment, rng.name, rng.first_seq, rng.last_seq, rng.count, rng.sha256, seq)
            status = await driver.execute(
                numbered("DELETE FROM events WHERE seq BETWEEN ? AND ? AND type = ANY(?::text[])"),
                rng.first_seq, rng.last_seq, list(types))
            removed = int(status.split()[-1])
            if removed != rng.count:
                raise ArchiveError(f"segment {rng.name} holds {rng.count} events but the live log has {removed} "
                                   f"archivable events in seq {rng.first_seq}..{rng.last_seq}: nothing removed")
            await driver.execute("SELECT pg_notify($1, $2)", CHANNEL, str(seq))
            return seq

        try:
            return await self._write(archive)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise AppendOnlyViolation(f"archiving refused by the log: {exc}") from exc

    @contextlib.asynccontextmanager
    async def archive_lock(self) -> AsyncIterator[None]:
        """One archive run at a time among every node sharing this database: a session advisory lock on a connection
        of its own, released when the run ends (or its process dies)."""
        try:
            conn = await asyncpg.connect(self.url.driver)
        except (OSError, asyncpg.PostgresError) as exc:
            raise LogUnreachable(f"the log's database at {self.location} cannot be reached: {exc}") from exc
        try:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", ARCHIVE_LOCK):
                raise ArchiveBusy("another node's archive run holds this log's archive lock")
            yield
        finally:
            await conn.close()

    async def _write(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """`work` on the writer connection inside one transaction, whole or not at all.

        NOTE: shielded from the caller's cancellation (a daemon stopping, a client going away): a transaction
        cancelled between its statements would stay open on the connection, and every later write would then be a
        savepoint inside it that never commits. The writer lock is held until the work is really over."""
        async with self._write_lock:
            try:
                driver = await self._driver()
            except (*_GONE, DBAPIError) as exc:  # SQLAlchemy wraps what a failed connect raised
                await self._drop_writer()
                raise LogUnreachable(f"the log's database at {self.location} cannot be reached: {exc}") from exc

            async def run() -> T:
                async with driver.transaction():
                    return await work(driver)

            task = asyncio.ensure_future(run())
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                with contextlib.suppress(BaseException):
                    await task
                raise
            except asyncpg.IntegrityConstraintViolationError:
                raise
            except _GONE as exc:
                # The connection (or the server) went away: drop it, so the next write connects afresh (the group
                # commit retries its batch; a control event fails its command).
                await self._drop_writer()
                raise LogUnreachable(f"the log's database at {self.location} cannot be reached: {exc}") from exc
            except asyncpg.PostgresError as exc:
                raise LogError(f"write to the log failed: {exc}") from exc

    async def _drop_writer(self) -> None:
        wconn, self._wconn, self._driver_conn = self._wconn, None, None
        if wconn is not None:
            with contextlib.suppress(Exception):
                await wconn.invalidate()
            with contextlib.suppress(Exception):
                await wconn.close()

    async def _driver(self) -> Any:
        """The writer connection's asyncpg connection, connected again when it was lost."""
        if self._closed:
            raise LogError("the log is closed")
        if self._wconn is None:
            self._wconn = await self._engine.connect()
            self._driver_conn = None
        if self._driver_conn is None:
            self._driver_conn = (await self._wconn.get_raw_connection()).driver_connection
            self._own_pid = self._driver_conn.get_server_pid()
        return self._driver_conn

    async def _execute_write(self, sql: str, rows: Sequence[Sequence[Any]] | None = None) -> None:
        async def run(driver: Any) -> None:
            if rows is None:
                await driver.execute(numbered(sql))
            else:
                await driver.executemany(numbered(sql), rows)

        await self._write(run)

    @contextlib.asynccontextmanager
    async def write_transaction(self) -> AsyncIterator[AsyncConnection]:
        async with self._write_lock, self._engine.begin() as conn:
            yield conn

    # -- other processes' commits ----------------------------------------------------------------------------

    async def changed_elsewhere(self) -> bool:
        """Whether another backend committed since the last call (its NOTIFY arrived); the first call says yes."""
        await self._listening()
        changed = self._elsewhere != self._elsewhere_checked
        self._elsewhere_checked = self._elsewhere
        return changed

    def change_signature(self) -> tuple[tuple[int, int], ...]:
        """The count of other backends' notifications, and whether the listener is lost: a lost one shows as a
        change, so that the caller asks `changed_elsewhere`, which reconnects it."""
        lost = self._listen is None or self._listen.is_closed()
        return ((self._elsewhere, int(lost and not self._closed)),)

    async def _watch(self) -> ChangeWatch:
        return _NotifyWatch(self)

    # -- whole logs (migrate-to, restore) --------------------------------------------------------------------

    async def copy_in(self, batches: AsyncIterator[list[tuple[Any, ...]]], *, replace: bool = False,
                      archived: Sequence[ArchivedRange] = ()) -> int:
        """Write another log's rows, as they are (seq, ts, actor... unchanged), into this one in one transaction:
        appended after what it holds, or, with `replace`, instead of it (the schema made again by the migrations,
        so no trigger is ever switched off). Returns the rows written. The insert trigger still checks every seq:
        the other log's `archived` ranges go in first, so the gaps they explain are accepted (the segments
        themselves are files, read from this log's archive directory)."""
        from blazar.events.migrate_pg import drop_and_upgrade

        written = 0
        async with self._write_lock, self._engine.begin() as conn:
            driver: Any = (await conn.get_raw_connection()).driver_connection
            await driver.execute("SELECT pg_advisory_xact_lock($1)", APPEND_LOCK)
            if replace:
                await conn.run_sync(drop_and_upgrade)
            for r in archived:
                await driver.execute(numbered(INSERT_ARCHIVED), r.segment, r.name, r.first_seq, r.last_seq, r.count,
                                     r.sha256, r.archived_seq)
            async for rows in batches:
                if rows:
                    await driver.execute(_INSERT, *[list(c) for c in zip(*rows, strict=True)])
                    written += len(rows)
            await driver.execute("SELECT pg_notify($1, $2)", CHANNEL, "copied")
        self._last_seq = await self.last_seq()
        return written

    # -- reading ---------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[AsyncConnection]:
        async with self._engine.connect() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        """A pooled asyncpg connection (the driver's own, under SQLAlchemy's pool). One that a failure or a
        cancellation left mid-exchange or inside a transaction is discarded, never handed to the next reader."""
        try:
            conn = await self._engine.connect()
        except (*_GONE, DBAPIError) as exc:  # SQLAlchemy wraps what a failed connect raised
            raise LogUnreachable(f"the log's database at {self.location} cannot be reached: {exc}") from exc
        try:
            driver: Any = (await conn.get_raw_connection()).driver_connection
            try:
                yield driver
            except _GONE as exc:
                await conn.invalidate()
                raise LogUnreachable(f"the log's database at {self.location} went away: {exc}") from exc
            except BaseException:
                await conn.invalidate()
                raise
            if driver.is_in_transaction():
                await conn.invalidate()
        finally:
            await conn.close()

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        async with self._connection() as driver:
            return [tuple(r) for r in await driver.fetch(numbered(sql), *params)]

    @contextlib.asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[Fetch]:
        """A driver connection inside one REPEATABLE READ, read-only transaction: one snapshot of the log."""
        async with self._connection() as driver, driver.transaction(isolation="repeatable_read", readonly=True):
            async def fetch(sql: str, params: Sequence[Any]) -> Rows:
                return [tuple(r) for r in await driver.fetch(numbered(sql), *params)]

            yield fetch

    async def _has_live_trace(self, trace_id: str) -> bool:
        async with self._connection() as driver:
            return await driver.fetchval("SELECT 1 FROM events WHERE trace_id = $1 LIMIT 1", trace_id) is not None

    async def snapshot_into(self, target: Path) -> None:
        await copy_into_file(self._snapshot, target)


class _NotifyWatch(ChangeWatch):
    """Another backend's commit, seen by a tail: its NOTIFY arrived (LISTEN: no polling query). While nobody
    listens (the database away), the tail reads every `poll_interval`, at least 0.25 s apart."""

    def __init__(self, log: PgEventLog) -> None:
        self._log = log
        self._seen = log._elsewhere

    def mark(self) -> None:
        self._seen = self._log._elsewhere

    async def wait(self, own_commit: asyncio.Event, poll_interval: float) -> bool:
        log = self._log
        if log._elsewhere != self._seen:
            return True  # another backend committed: read it
        if not await log._listening():
            await asyncio.sleep(max(poll_interval, 0.25))  # nobody listens: poll until someone does
            return True
        own_commit.clear()
        log._notified.clear()
        waits = [asyncio.ensure_future(own_commit.wait()), asyncio.ensure_future(log._notified.wait())]
        try:
            await asyncio.wait(waits, timeout=max(poll_interval, 5.0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return False
