"""A SQLite log file's rows, read row for row (seq, ts, actor, cause and payload unchanged), and its `archived`
ranges, for a PostgreSQL log to take in (restores onto PostgreSQL). The other way, a log into the snapshot format's
SQLite file, is each store's `snapshot_into`."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from blazar.events.log_sql import READ_BATCH
from blazar.events.segment_store import ARCHIVED_COLUMNS, ArchivedRange


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


def sqlite_archived(db: Path) -> list[ArchivedRange]:
    """The file's `archived` ranges, oldest first (none in a log older than the archive's schema)."""
    conn = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True)
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'archived'").fetchone() is None:
            return []
        return [ArchivedRange.of(r) for r in conn.execute(f"SELECT {ARCHIVED_COLUMNS} FROM archived ORDER BY segment")]
    finally:
        conn.close()
