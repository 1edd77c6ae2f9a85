"""A log copied, from one consistent read of its store, into a new SQLite log file: the snapshot format, written
by a store that is not that file already (PostgreSQL's `snapshot_into`; SQLite's own is `VACUUM INTO`)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

from blazar.events.log_sql import INSERT_ARCHIVED, INSERT_INTO_FILE, READ_BATCH, Fetch, live_batches
from blazar.events.migrate import ensure_schema
from blazar.events.segment_store import ARCHIVED_COLUMNS


async def copy_into_file(snapshot: Callable[[], contextlib.AbstractAsyncContextManager[Fetch]], target: Path) -> None:
    """The `archived` ranges first, then the live rows, gaps and all, read inside one `snapshot()` of the store."""
    await asyncio.to_thread(ensure_schema, target)
    conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
    try:
        await asyncio.to_thread(conn.execute, "BEGIN IMMEDIATE")
        async with snapshot() as fetch:
            ranges = await fetch(f"SELECT {ARCHIVED_COLUMNS} FROM archived ORDER BY segment", ())
            await asyncio.to_thread(conn.executemany, INSERT_ARCHIVED, ranges)
            async for rows in live_batches(fetch, [], [], 0, None, None, READ_BATCH):
                await asyncio.to_thread(conn.executemany, INSERT_INTO_FILE, rows)
        await asyncio.to_thread(conn.execute, "COMMIT")
        await asyncio.to_thread(conn.execute, "PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
