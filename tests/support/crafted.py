"""A snapshot as someone handing the user a backup could make one: a home's log with events Blazar never wrote
appended straight to it, copied and sealed with a manifest that matches it byte for byte (`blazar snapshot` itself
refuses to write one)."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path

import orjson

from blazar.bootstrap import bootstrap
from blazar.events import Event
from blazar.operations.snapshot_verify import DB_FILE, FORMAT, FORMAT_VERSION, MANIFEST, Manifest
from blazar.paths import Paths


def append(paths: Paths, events: list[Event]) -> list[int]:
    """Record `events` in the home's log as they are (no handler, no check); their seqs."""

    async def go() -> list[int]:
        app = await bootstrap(paths=paths, env={}, actor="test:crafted")
        try:
            return [r.seq for r in await app.record(events)]
        finally:
            await app.close()

    return asyncio.run(go())


def seal(paths: Paths, dest: Path) -> Path:
    """Copy the home's log into `dest` (a new directory) with a manifest that tells the truth about the copy."""
    dest.mkdir(parents=True)
    db = dest / DB_FILE
    src = sqlite3.connect(paths.db)
    try:
        src.execute("VACUUM INTO ?", (str(db),))
    finally:
        src.close()
    conn = sqlite3.connect(db)
    try:
        count, first, last = conn.execute("SELECT COUNT(*), MIN(seq), MAX(seq) FROM events").fetchone()
        counts = dict(conn.execute("SELECT type, COUNT(*) FROM events GROUP BY type ORDER BY type").fetchall())
        (revision,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    finally:
        conn.close()
    data = db.read_bytes()
    manifest = Manifest(format=FORMAT, format_version=FORMAT_VERSION, created_at="2025-01-01T00:00:00Z",
                        blazar_version="0", schema_revision=revision, seq_first=first, seq_last=last,
                        event_count=count, counts_by_type=counts, db_file=DB_FILE, db_bytes=len(data),
                        db_sha256=hashlib.sha256(data).hexdigest(), models=[])
    (dest / MANIFEST).write_bytes(orjson.dumps(manifest.model_dump(mode="json")))
    return dest
