"""The log's schema on PostgreSQL: the same Alembic scripts (`migrations/`) as on SQLite, run through SQLAlchemy's
async engine. Start-up skips Alembic when the database already stands at head; processes starting at once take a
session advisory lock, so only the first migrates."""

from __future__ import annotations

from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import create_async_engine

from blazar.errors import LogError, SchemaOutOfDate
from blazar.events.location import PostgresUrl
from blazar.events.migrate import SCHEMA_HEAD, SchemaStatus, _script_directory

MIGRATE_LOCK = 0x626C617A6D69  # "blazmi": only the migrations take it


async def current_revision(url: PostgresUrl) -> str | None:
    """The revision the database stands at, or None for an empty database."""
    conn = await _connect(url)
    try:
        return await _revision(conn)
    finally:
        await conn.close()


async def _connect(url: PostgresUrl) -> Any:
    try:
        return await asyncpg.connect(url.driver)
    except (OSError, asyncpg.PostgresError) as e:
        raise LogError(f"cannot reach the log's database at {url}: {e}") from e


async def _revision(conn: Any) -> str | None:
    if await conn.fetchval("SELECT to_regclass('alembic_version')") is None:
        return None
    version = await conn.fetchval("SELECT version_num FROM alembic_version")
    return None if version is None else str(version)


async def status(url: PostgresUrl) -> SchemaStatus:
    current = await current_revision(url)
    _, scripts = _script_directory()
    head = scripts.get_current_head()
    assert head is not None
    known = {s.revision for s in scripts.walk_revisions()}
    if current is not None and current not in known:
        raise SchemaOutOfDate(f"{url} is at schema revision {current!r}, which this Blazar does not know: "
                              "it was written by a newer version")
    pending: list[str] = []
    for script in scripts.walk_revisions(base="base", head=head):
        if script.revision == current:
            break
        pending.append(script.revision)
    pending.reverse()
    return SchemaStatus(location=url, current=current, head=head, pending=pending)


async def upgrade(url: PostgresUrl) -> SchemaStatus:
    """Run every pending migration, under the migration lock. Returns the status before."""
    before = await status(url)
    if before.up_to_date:
        return before
    await _upgrade_locked(url)
    return before


async def ensure_schema(url: PostgresUrl) -> None:
    """Start-up hook: upgrade when needed, cheaply skip when already at head."""
    if await current_revision(url) == SCHEMA_HEAD:
        return
    await _upgrade_locked(url)


async def _upgrade_locked(url: PostgresUrl) -> None:
    from alembic import command

    lock = await _connect(url)
    try:
        await lock.execute("SELECT pg_advisory_lock($1)", MIGRATE_LOCK)
        if await _revision(lock) == SCHEMA_HEAD:
            return
        cfg, _ = _script_directory()
        engine = create_async_engine(url.sqlalchemy)
        try:
            async with engine.begin() as conn:
                def run(sync_conn: Any) -> None:
                    cfg.attributes["connection"] = sync_conn
                    command.upgrade(cfg, "head")

                await conn.run_sync(run)
        finally:
            await engine.dispose()
    finally:
        await lock.close()  # a session lock: released with the connection



def drop_and_upgrade(sync_conn: Any) -> None:
    """Inside the caller's transaction: the log's tables and functions dropped and made again at head by the
    migrations themselves (a restore replaces the whole log; PostgreSQL's DDL is transactional: all or nothing)."""
    from alembic import command

    sync_conn.exec_driver_sql("DROP TABLE IF EXISTS events, checkpoints, archived, alembic_version")
    sync_conn.exec_driver_sql("DROP FUNCTION IF EXISTS blazar_events_append_only(), blazar_events_gap_free(), "
                              "blazar_events_archived_only()")
    cfg, _ = _script_directory()
    cfg.attributes["connection"] = sync_conn
    command.upgrade(cfg, "head")
