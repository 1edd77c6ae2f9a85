"""`blazar db status|upgrade`: the log database's schema revision, size and contents."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from blazar.bootstrap import paths_from_env
from blazar.cli.common import JSON_OPTION, out, print_json, run
from blazar.events import migrate
from blazar.events.location import PostgresUrl, SqliteFile
from blazar.logdb import log_location

app = typer.Typer(help="The log database: schema status and upgrades.", no_args_is_help=True)

# What left the live log for archive segments: `events` counts the live rows only, so seq_last - events of them
# are in segments (`blazar log status` lists them).
_ARCHIVED = "SELECT COUNT(*), COALESCE(SUM(count), 0) FROM archived"


def _contents(db: Path) -> dict[str, Any]:
    if not db.exists():
        return {"events": 0, "seq_first": None, "seq_last": None, "archived_events": 0, "archived_segments": 0,
                "bytes": 0, "journal_mode": None}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        count, first, last = conn.execute("SELECT COUNT(*), MIN(seq), MAX(seq) FROM events").fetchone() if (
            "events" in tables) else (0, None, None)
        segments, archived = conn.execute(_ARCHIVED).fetchone() if "archived" in tables else (0, 0)
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()
    wal = db.with_name(db.name + "-wal")
    size = db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    return {"events": count, "seq_first": first, "seq_last": last, "archived_events": archived,
            "archived_segments": segments, "bytes": size, "journal_mode": mode}


@app.command()
def status(as_json: bool = JSON_OPTION) -> None:
    """Show the schema revision, pending migrations, and what the log holds (does not migrate): its live events and
    seq range, and how many events archive segments hold."""
    paths = paths_from_env()
    match log_location(paths, os.environ):
        case PostgresUrl() as url:
            info = run(_database_status(url))
        case SqliteFile(db):
            st = migrate.status(db)
            info = {"path": str(db), "current": st.current, "head": st.head, "pending": st.pending,
                    "up_to_date": st.up_to_date, **_contents(db)}
    if as_json:
        print_json(info)
        return
    table = Table(show_header=False, box=None)
    for k, v in info.items():
        table.add_row(f"[bold]{k}[/bold]", str(v))
    out.print(table)


@app.command()
def upgrade() -> None:
    """Apply pending schema migrations (Blazar also does this at start-up)."""
    paths = paths_from_env()
    paths.ensure()
    match log_location(paths, os.environ):
        case PostgresUrl() as url:
            from blazar.events import migrate_pg

            before = run(migrate_pg.upgrade(url))
        case SqliteFile(db):
            before = migrate.upgrade(db)
    where = before.location
    if before.up_to_date:
        out.print(f"{where}: already at {before.head}", markup=False)
    else:
        out.print(f"{where}: {before.current or 'new'} -> {before.head} ({', '.join(before.pending)})", markup=False)


async def _database_status(url: PostgresUrl) -> dict[str, Any]:
    """The same facts for a log on PostgreSQL (the URL without its password)."""
    from blazar.events import migrate_pg

    st = await migrate_pg.status(url)
    info: dict[str, Any] = {"path": url.redacted, "backend": "postgresql", "current": st.current, "head": st.head,
                            "pending": st.pending, "up_to_date": st.up_to_date}
    import asyncpg

    conn = await asyncpg.connect(url.driver)
    try:
        if st.current is not None:
            count, first, last = await conn.fetchrow("SELECT COUNT(*), MIN(seq), MAX(seq) FROM events")
            segments, archived = (await conn.fetchrow(_ARCHIVED) if await conn.fetchval(
                "SELECT to_regclass('archived') IS NOT NULL") else (0, 0))
            size = await conn.fetchval("SELECT pg_total_relation_size('events')")
            info.update(events=count, seq_first=first, seq_last=last, archived_events=int(archived),
                        archived_segments=int(segments), bytes=size)
    finally:
        await conn.close()
    return info


@app.command("migrate-to")
def migrate_to(
    url: str = typer.Argument(..., help="An empty PostgreSQL database: postgresql+asyncpg://USER@HOST:PORT/DB "
                              "(a password from PGPASSWORD or ~/.pgpass)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Copy this home's SQLite log into an empty PostgreSQL database and verify the copy (the audit hash chain and a
    digest of every row). The home keeps using SQLite until database_url (or BLAZAR_DATABASE_URL) names the
    database. Stop the daemon first."""
    import io

    from blazar.cli.common import opened
    from blazar.events.log import EventLog
    from blazar.operations.migrate_to import migrate_to as copy_log
    from blazar.queries.audit import export_audit

    target = PostgresUrl.parse(url)  # before anything opens: a URL that cannot be read is refused as it is

    async def chain(log: EventLog, now: float) -> tuple[int, str]:
        summary = await export_audit(log, io.BytesIO(), pii_scrub=False, now=now)
        return summary.records, summary.head

    async def go() -> Any:
        async with opened() as app_:
            return await copy_log(app_, target, audit_chain=chain)

    done = run(go())
    if as_json:
        print_json(done.to_json())
        return
    out.print(f"copied {done.events} events to {done.url}; verified: audit chain of {done.audit_records} records "
              f"(head {done.audit_head[:16]}...), every row's sha256 {done.rows_sha256[:16]}...", markup=False)
    out.print("to use it: blazar config set log.database_url URL (or set BLAZAR_DATABASE_URL), then start Blazar",
              markup=False)
