"""`blazar db migrate-to URL`: the embedded SQLite log copied into an empty PostgreSQL database, row for row, then
verified: the audit hash chain exported from both (one `exported_at`, so equal logs give equal chain heads) and a
digest of every row must agree. Nothing is switched over: the home keeps its SQLite log until `database_url` says
otherwise.

An archived log goes as it is stored: its `archived` ranges, then its live rows with the gaps they explain; the
segments stay files in the home's archive directory, which the PostgreSQL log reads too (both digests read the
whole history, segments included)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from blazar.context import Blazar
from blazar.errors import DaemonRunning, LogError
from blazar.events.location import PostgresUrl, SqliteFile
from blazar.events.log import EventLog
from blazar.runlock import holder


@dataclass(frozen=True, slots=True)
class Migrated:
    url: str  # redacted
    events: int
    audit_records: int
    audit_head: str
    rows_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "events": self.events, "audit_records": self.audit_records,
                "audit_head": self.audit_head, "rows_sha256": self.rows_sha256}


async def rows_digest(log: EventLog) -> tuple[int, str]:
    """How many rows the log holds and a sha256 over all of them, in seq order (the payload text as stored)."""
    h, n = hashlib.sha256(), 0
    async for rows in log.read_rows():
        for row in rows:
            h.update(repr(tuple(row)).encode())
        n += len(rows)
    return n, h.hexdigest()


# The audit chain of a log as of `now`: (records, head). The caller hands it in (blazar.queries.audit's export),
# which keeps this command off the query side.
AuditChain = Callable[[EventLog, float], Awaitable[tuple[int, str]]]


async def migrate_to(app: Blazar, url: PostgresUrl, *, audit_chain: AuditChain) -> Migrated:
    from blazar.events.log_pg import PgEventLog  # asyncpg only now

    if not isinstance(app.log.location, SqliteFile):
        raise LogError(f"this home's log is already in a database ({app.log.location})")
    pid = holder(app.paths.daemon_lock)
    if pid is not None:
        raise DaemonRunning(f"a Blazar daemon (pid {pid}) is running; stop it first, so the log does not grow while "
                            "it is copied")
    target = await PgEventLog.open(url)
    try:
        held = await target.last_seq()
        if held:
            raise LogError(f"{url} already holds a log ({held} events): migrate-to needs an empty database")
        target.archive = app.log.archive
        ranges = await app.log.archived_ranges()
        copied = await target.copy_in(app.log.read_live_rows(), archived=ranges)
        if await target.archived_ranges() != ranges:
            raise LogError(f"the copy in {url} does not verify: its archived ranges differ from the SQLite log's")
        now = app.clock.now()
        ours, theirs = await audit_chain(app.log, now), await audit_chain(target, now)
        if ours != theirs:
            raise LogError(f"the copy in {url} does not verify: audit chain {theirs[0]} records, head "
                           f"{theirs[1]}; the SQLite log has {ours[0]}, head {ours[1]}")
        (n_ours, d_ours), (n_theirs, d_theirs) = await rows_digest(app.log), await rows_digest(target)
        if (n_ours, d_ours) != (n_theirs, d_theirs):
            raise LogError(f"the copy in {url} does not verify: {n_theirs} rows (sha256 {d_theirs}) against "
                           f"{n_ours} ({d_ours})")
    finally:
        await target.close()
    return Migrated(url=url.redacted, events=copied, audit_records=ours[0], audit_head=ours[1], rows_sha256=d_ours)
