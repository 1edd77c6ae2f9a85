"""The append-only log: one SQLite table, one writer connection, readers on their own connections.

Appends are transactions under `BEGIN IMMEDIATE` that take `MAX(seq)+1` inside the transaction, so several
processes (the daemon and a CLI command) can append safely; the insert trigger makes the log gap-free.
`append` is the durable path (returns after COMMIT, with `synchronous=FULL`); the group-commit writer in
`writer.py` batches request events through `commit_pending`. Reads stream rows in batches and decode them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import event as sa_event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from blazar.clock import Clock, SystemClock
from blazar.diskspace import disk_full, no_space
from blazar.errors import AppendOnlyViolation, LogError
from blazar.events.base import Event, Pending, Recorded
from blazar.events.migrate import ensure_schema
from blazar.events.registry import decode, encode

_COLUMNS = "seq, ts, type, v, stream, trace_id, actor, cause, data"
_INSERT = f"INSERT INTO events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
# A batch this small goes in as one statement (9 parameters a row, under SQLite's 32766), which is a transaction
# of its own: one round trip to the driver's thread instead of four (BEGIN, MAX, insert, COMMIT).
ONE_STATEMENT_ROWS = 3000
READ_BATCH = 5000
# This process's commits a follow() keeps until it yields them; past that it reads the database instead.
FOLLOW_BUFFER = 10_000
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
    sql = (f"INSERT INTO events ({_COLUMNS}) SELECT base.s + r.column1, r.column2, r.column3, r.column4, r.column5,"
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


def row_to_recorded(row: Sequence[Any]) -> Recorded:
    seq, ts, type_name, v, stream, trace_id, actor, cause, data = row
    return Recorded(
        seq=seq,
        ts=ts,
        type=type_name,
        v=v,
        stream=stream,
        trace_id=trace_id,
        actor=actor,
        cause=cause,
        event=decode(seq, type_name, v, data),
    )


class EventLog:
    """The log. Open with `await EventLog.open(path)`; close with `await log.close()`."""

    backend = "sqlite"

    def __init__(self, path: Path, writer: AsyncEngine, reader: AsyncEngine, clock: Clock) -> None:
        self.path = path
        self.location = str(path)
        self.clock = clock
        self._writer_engine = writer
        self._reader_engine = reader
        self._wconn: AsyncConnection | None = None
        self._write_lock = asyncio.Lock()
        self._last_seq = 0
        self._listeners: list[Callable[[list[Recorded]], None]] = []
        self._data_version: int | None = None  # the writer connection's PRAGMA data_version, last read
        self._driver_conn: Any = None  # the writer's aiosqlite connection, under SQLAlchemy's
        self._file_names = (str(path), str(path) + "-wal")  # what files_signature stats, 4 times a second idle
        self._lookup: AsyncConnection | None = None  # a reader kept open for has_trace (opened on first use)
        self._lookup_lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path, *, clock: Clock | None = None, migrate: bool = True) -> EventLog:
        path.parent.mkdir(parents=True, exist_ok=True)
        log = cls(path, _engine(path, immediate=True), _engine(path, immediate=False), clock or SystemClock())
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

    async def __aenter__(self) -> EventLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- writing -------------------------------------------------------------------------------------------

    def pending(
        self,
        event: Event,
        *,
        actor: str,
        stream: str | None = None,
        trace_id: str | None = None,
        cause: int | None = None,
        ts: float | None = None,
    ) -> Pending:
        return Pending(
            event=event,
            stream=stream or event.stream_key(),
            trace_id=trace_id,
            actor=actor,
            cause=cause,
            ts=self.clock.now() if ts is None else ts,
        )

    async def append(
        self,
        events: Event | Iterable[Event],
        *,
        actor: str,
        stream: str | None = None,
        trace_id: str | None = None,
        cause: int | None = None,
    ) -> list[Recorded]:
        """Durable append: the events are committed (fsynced) when this returns."""
        batch = [events] if isinstance(events, Event) else list(events)
        pend = [self.pending(e, actor=actor, stream=stream, trace_id=trace_id, cause=cause) for e in batch]
        return await self.commit_pending(pend)

    async def commit_pending(self, batch: Sequence[Pending]) -> list[Recorded]:
        """Commit a batch in one transaction, assigning consecutive seqs. All or nothing."""
        if not batch:
            return []
        encoded = [(p, encode(p.event)) for p in batch]  # validate before touching the database
        assert self._wconn is not None, "log is closed"
        async with self._write_lock:
            # NOTE: on the driver connection itself, as reads are: SQLAlchemy's statement machinery cost more CPU
            # than the insert (a group commit is on every request's path).
            driver = await self._driver()
            try:
                if len(encoded) <= ONE_STATEMENT_ROWS:
                    first = await _insert_one_statement(driver, encoded)
                else:
                    first = await _insert_in_transaction(driver, encoded)
            except sqlite3.IntegrityError as exc:
                raise AppendOnlyViolation(f"append refused by the log: {exc}") from exc
            except sqlite3.OperationalError as exc:
                raise self._no_space(exc) or LogError(f"append failed: {exc}") from exc
        rows = [(first + i + 1, p.ts, p.event.TYPE, p.event.V, p.stream, p.trace_id, p.actor, p.cause, data)
                for i, (p, data) in enumerate(encoded)]
        self._last_seq = rows[-1][0]
        recorded = [
            Recorded(
                seq=r[0], ts=r[1], type=r[2], v=r[3], stream=r[4], trace_id=r[5], actor=r[6], cause=r[7],
                event=p.event,
            )
            for r, (p, _) in zip(rows, encoded, strict=True)
        ]
        for listener in self._listeners:
            listener(recorded)
        return recorded

    @property
    def last_appended(self) -> int:
        """The last seq this process committed."""
        return self._last_seq

    async def _driver(self) -> Any:
        """The writer's aiosqlite connection (the same one SQLAlchemy holds), looked up once."""
        if self._driver_conn is None:
            assert self._wconn is not None, "log is closed"
            self._driver_conn = (await self._wconn.get_raw_connection()).driver_connection
            assert self._driver_conn is not None  # None only once the pool has invalidated the connection
        return self._driver_conn

    def subscribe(self, listener: Callable[[list[Recorded]], None]) -> Callable[[], None]:
        """Call `listener` with every batch this process commits, as it commits (no read back); returns the
        function that unsubscribes it. Other processes' appends are found with `changed_elsewhere`."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

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

    # -- derived tables (checkpoints) ------------------------------------------------------------------------

    async def checkpoint_rows(self) -> list[tuple[Any, ...]]:
        """Every stored checkpoint: (name, version, seq, anchor, state, sha256)."""
        async with self.reader() as conn:
            rows = (await conn.exec_driver_sql("SELECT name, version, seq, anchor, state, sha256 FROM checkpoints"))
            return [tuple(r) for r in rows.all()]

    async def event_anchor(self, seq: int) -> tuple[str, float] | None:
        """(type, ts) of the event at `seq`, or None."""
        async with self.reader() as conn:
            row: Any = (await conn.exec_driver_sql("SELECT type, ts FROM events WHERE seq = ?", (seq,))).first()
        return None if row is None else (row[0], row[1])

    async def put_checkpoints(self, rows: list[tuple[Any, ...]]) -> None:
        """Write (name, version, seq, anchor, state, sha256, ts) rows, replacing older ones, in one transaction."""
        async with self.write_transaction() as conn:
            await conn.exec_driver_sql(
                "INSERT OR REPLACE INTO checkpoints (name, version, seq, anchor, state, sha256, ts) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)

    async def clear_checkpoints(self) -> None:
        async with self.write_transaction() as conn:
            await conn.exec_driver_sql("DELETE FROM checkpoints")

    # -- reading -------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[AsyncConnection]:
        async with self._reader_engine.connect() as conn:
            yield conn

    async def last_seq(self) -> int:
        async with self.reader() as conn:
            return int((await conn.exec_driver_sql("SELECT COALESCE(MAX(seq), 0) FROM events")).scalar_one())

    async def seq_at_time(self, ts: float) -> int:
        """The last seq recorded at or before `ts` (0 when none)."""
        async with self.reader() as conn:
            res = await conn.exec_driver_sql("SELECT COALESCE(MAX(seq), 0) FROM events WHERE ts <= ?", (ts,))
            return int(res.scalar_one())

    async def trace_ids_starting(self, prefix: str, *, limit: int = 2) -> list[str]:
        """The distinct trace ids that start with `prefix`, in order (a range over the trace index)."""
        sql = "SELECT DISTINCT trace_id FROM events WHERE trace_id >= ? AND trace_id < ? ORDER BY trace_id LIMIT ?"
        async with self.reader() as conn:
            rows = (await conn.exec_driver_sql(sql, (prefix, prefix + "\U0010ffff", limit))).all()
        return [row[0] for row in rows]

    async def has_trace(self, trace_id: str) -> bool:
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

    async def read(
        self,
        *,
        after: int = 0,
        upto: int | None = None,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        trace_id: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        batch: int = READ_BATCH,
    ) -> AsyncIterator[Recorded]:
        """Events in seq order matching every filter given (`after` is exclusive, `upto` inclusive)."""
        async for rows in self.read_rows(
            after=after, upto=upto, types=types, stream=stream, trace_id=trace_id,
            since=since, until=until, limit=limit, batch=batch,
        ):
            for row in rows:
                yield row_to_recorded(row)

    async def read_rows(
        self,
        *,
        after: int = 0,
        upto: int | None = None,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        trace_id: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        batch: int = READ_BATCH,
    ) -> AsyncIterator[list[tuple[Any, ...]]]:
        """Undecoded rows (plain tuples) in batches, keyset-paginated on seq, all from one read snapshot."""
        where = ["seq > ?"]
        params: list[Any] = [after]
        if upto is not None:
            where.append("seq <= ?")
            params.append(upto)
        if types:
            where.append(f"type IN ({', '.join('?' * len(types))})")
            params.extend(types)
        if stream is not None:
            where.append("stream = ?")
            params.append(stream)
        if trace_id is not None:
            where.append("trace_id = ?")
            params.append(trace_id)
        if since is not None:
            where.append("ts >= ?")
            params.append(since)
        if until is not None:
            where.append("ts <= ?")
            params.append(until)
        sql = f"SELECT {_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"
        remaining = limit
        async with self.reader() as conn, conn.begin():
            # One read transaction, so every batch comes from the same snapshot of the log. Batches are fetched
            # on the driver connection itself: plain tuples, without SQLAlchemy's per-row Row objects (about a
            # tenth of replay time in bench/log.py).
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None  # None only once the pool has invalidated the connection
            while remaining is None or remaining > 0:
                n = batch if remaining is None else min(batch, remaining)
                rows = list(await driver.execute_fetchall(sql, (*params, n)))
                if not rows:
                    return
                yield rows
                params[0] = rows[-1][0]
                if remaining is not None:
                    remaining -= len(rows)
                if len(rows) < n:
                    return

    async def follow(
        self,
        *,
        after: int = 0,
        poll_interval: float = 0.25,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        trace_id: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> AsyncIterator[Recorded]:
        """A live tail: every matching event after `after`, then each new one as it is appended.

        This process's commits are handed over as they commit, with no read back, as long as their seqs run on
        from the last one seen (a query per commit would cost a reader connection each: about 1 ms of CPU per
        request with a console open). The database is read to catch up at the start, when the seqs jump (another
        process committed in between, or the tail fell `FOLLOW_BUFFER` behind), and when another process's commit
        shows while this one is quiet: the files' signature is stat-ed every `poll_interval`, and only when it
        moved is SQLite's data_version asked whether the change was another connection's. An idle tail costs
        the stat of two files per poll.
        """
        types_wanted = frozenset(types) if types else None

        def wanted(rec: Recorded) -> bool:
            return ((types_wanted is None or rec.type in types_wanted)
                    and (stream is None or rec.stream == stream)
                    and (trace_id is None or rec.trace_id == trace_id)
                    and (since is None or rec.ts >= since) and (until is None or rec.ts <= until))

        local: deque[Recorded] = deque(maxlen=FOLLOW_BUFFER)
        arrived = asyncio.Event()

        def on_commit(batch: list[Recorded]) -> None:
            local.extend(batch)
            arrived.set()

        unsubscribe = self.subscribe(on_commit)
        try:
            version = await self._read_data_version()
            while True:
                # From the database: up to a seq read first, so that `after` passes the non-matching events too.
                seen = self.files_signature()
                top = await self.last_seq()
                async for rec in self.read(after=after, upto=top, types=types, stream=stream, trace_id=trace_id,
                                           since=since, until=until):
                    yield rec
                after = max(after, top)
                # Then from this process's commits, until a jump in seqs or another process's commit.
                while True:
                    while local and local[0].seq <= after:
                        local.popleft()
                    if local:
                        if local[0].seq != after + 1:
                            break
                        rec = local.popleft()
                        after = rec.seq
                        if wanted(rec):
                            yield rec
                        continue
                    arrived.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(poll_interval):
                            await arrived.wait()
                    if local:
                        continue
                    signature = self.files_signature()
                    if signature != seen:
                        seen = signature
                        now = await self._read_data_version()
                        if now != version:  # another connection committed: read it
                            version = now
                            break
        finally:
            unsubscribe()

    def files_signature(self) -> tuple[tuple[int, int], ...]:
        """(mtime_ns, size) of the database and its WAL: any commit, by any process, changes one of them."""
        out = []
        for path in self._file_names:
            try:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, -1))
        return tuple(out)
