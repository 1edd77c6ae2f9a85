"""Whole logs copied between backends, row for row (seq, ts, actor, cause and payload unchanged): a PostgreSQL log
read into the snapshot format's SQLite file (snapshots, the log a restore keeps aside), and a SQLite file's rows
read for a PostgreSQL log to take in (`blazar db migrate-to`, restores onto PostgreSQL)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from blazar.events.log import READ_BATCH, EventLog
from blazar.events.migrate import ensure_schema

_INSERT = ("INSERT INTO events (seq, ts, type, v, stream, trace_id, actor, cause, data) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")


async def export_to_sqlite(log: EventLog, target: Path) -> int:
    """Every event of `log`, from one consistent read, into a new SQLite log at `target`; returns how many."""
    await asyncio.to_thread(ensure_schema, target)
    conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
    try:
        await asyncio.to_thread(conn.execute, "BEGIN IMMEDIATE")
        n = 0
        async for rows in log.read_rows():
            await asyncio.to_thread(conn.executemany, _INSERT, rows)
            n += len(rows)
        await asyncio.to_thread(conn.execute, "COMMIT")
        await asyncio.to_thread(conn.execute, "PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return n


def _fetch(conn: sqlite3.Connection, after: int, batch: int) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT seq, ts, type, v, stream, trace_id, actor, cause, data FROM events WHERE seq > ? "
                        "ORDER BY seq LIMIT ?", (after, batch)).fetchall()


async def sqlite_rows(db: Path, batch: int = READ_BATCH) -> AsyncIterator[list[tuple[Any, ...]]]:
    """A SQLite log's rows in seq order, in batches, read-only (a snapshot's file is never written to)."""
    uri = db.absolute().as_uri()  # noqa: ASYNC240 (a getcwd at most)
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False)
    try:
        after = 0
        while True:
            rows = await asyncio.to_thread(_fetch, conn, after, batch)
            if not rows:
                return
            yield rows
            after = rows[-1][0]
    finally:
        conn.close()
