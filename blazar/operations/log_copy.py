"""A SQLite log file's rows, read row for row (seq, ts, actor, cause and payload unchanged) for a PostgreSQL log to
take in (`blazar db migrate-to`, restores onto PostgreSQL). The other way, a log into the snapshot format's SQLite
file, is each store's `snapshot_into`."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from blazar.events.log import READ_BATCH


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
