"""The log's own health when it lives in PostgreSQL: the database reached, the schema at head, seq without gaps, the
append-only triggers in place, and the clock against the last event. (PostgreSQL checks its own pages: no
integrity pragma to run.)"""

from __future__ import annotations

import time
from typing import Any

from blazar.errors import BlazarError
from blazar.events.location import PostgresUrl
from blazar.operations.doctor import seqcheck
from blazar.operations.doctor.logdb import CLOCK_SLACK_S
from blazar.operations.doctor.report import Check, ok

TRIGGERS = ("events_gap_free", "events_no_delete", "events_no_truncate", "events_no_update")
_RESTORE = "restore the latest snapshot: `blazar restore PATH` (`blazar snapshot` makes them)"


async def log_checks(url: PostgresUrl, *, now: float | None = None) -> list[Check]:
    import asyncpg

    from blazar.events import migrate_pg

    now = time.time() if now is None else now
    where = url.redacted
    try:
        conn = await asyncpg.connect(url.driver, timeout=10)
    except (OSError, asyncpg.PostgresError, TimeoutError) as e:
        return [Check("log", "database", "fail", f"cannot reach the log's database {where}: {e}",
                      fix="start PostgreSQL, or correct database_url / BLAZAR_DATABASE_URL")]
    try:
        checks = [ok("log", "database", f"the log is in PostgreSQL at {where} "
                     f"(server {conn.get_server_version().major})")]
        try:
            st = await migrate_pg.status(url)
        except BlazarError as e:
            return [*checks, Check("log", "schema", "fail", e.message,
                                   fix="upgrade Blazar to the version that wrote this log")]
        if st.current is None:
            return [*checks, ok("log", "schema", "no log yet in this database: the first command creates it")]
        checks.append(ok("log", "schema", f"schema at head ({st.head})") if st.up_to_date else
                      Check("log", "schema", "warn", f"schema at {st.current}, head is {st.head}",
                            fix="blazar db upgrade"))
        checks.append(await _seq(conn))
        have = {r[0] for r in await conn.fetch(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'events'::regclass AND NOT tgisinternal")}
        missing = [t for t in TRIGGERS if t not in have]
        checks.append(ok("log", "triggers", "append-only triggers present: " + ", ".join(TRIGGERS)) if not missing
                      else Check("log", "triggers", "fail", f"missing trigger(s) {', '.join(missing)}: the log no "
                                 "longer refuses UPDATE, DELETE, TRUNCATE or a gap", fix=_RESTORE))
        row = await conn.fetchrow("SELECT ts, seq FROM events ORDER BY seq DESC LIMIT 1")
        if row is not None and now + CLOCK_SLACK_S < float(row[0]):
            checks.append(Check("log", "clock", "fail", f"the clock reads {float(row[0]) - now:.0f} s before the last "
                                f"event (seq {row[1]})", fix="set the system clock (timedatectl set-ntp true)"))
        else:
            checks.append(ok("log", "clock", "the clock is not behind the last event"))
        return checks
    finally:
        await conn.close()


def _numbered(sql: str) -> str:
    """`?` placeholders as asyncpg's $1, $2, ..."""
    parts = sql.split("?")
    return "".join(p + (f"${i + 1}" if i < len(parts) - 1 else "") for i, p in enumerate(parts))


async def _seq(conn: Any) -> Check:
    """Seq 1..last whole, the archived ranges counted (blazar/operations/doctor/seqcheck.py)."""
    count, last = await conn.fetchrow("SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM events")
    has_archived = await conn.fetchval("SELECT to_regclass('archived') IS NOT NULL")
    ranges = await conn.fetch("SELECT first_seq, last_seq, count FROM archived") if has_archived else []
    facts = seqcheck.SeqFacts(count=int(count), last=int(last), ranges=[(int(a), int(b), int(c)) for a, b, c in ranges])
    live_in = 0
    for lo, hi in facts.union():
        live_in += int(await conn.fetchval("SELECT COUNT(*) FROM events WHERE seq BETWEEN $1 AND $2", lo, hi))
    gaps = None
    if not seqcheck.whole(facts, live_in):
        rows = await conn.fetch(_numbered(seqcheck.gaps_sql(has_archived=bool(has_archived))), int(last),
                                len(ranges) + seqcheck.GAPS_READ)
        gaps = [(int(lo), int(hi)) for lo, hi in rows]
    return seqcheck.verdict(facts, live_in, gaps)
