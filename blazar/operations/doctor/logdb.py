"""The log's own health, read with a plain read-only SQLite connection before anything opens (and migrates) it:
integrity, gap-free seq, the append-only triggers, the schema revision, and the clock against the last event.

A full disk is not a damaged log: SQLite cannot even open a log whose WAL index it cannot create, and says "disk I/O
error". Then the file is checked as it stands on disk (read-only, `immutable`: no index, no WAL, no lock) and the
verdict says "disk full", with the space to free, never "restore a snapshot" (that would drop every later event)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from blazar.diskspace import LOG_HEADROOM_BYTES, no_space, size, space
from blazar.errors import BlazarError
from blazar.events import migrate
from blazar.operations.doctor import seqcheck
from blazar.operations.doctor.report import Check, ok

TRIGGERS = ("events_gap_free", "events_no_delete", "events_no_update")
# A clock this far behind the last event is wrong (a restored VM, a dead RTC battery); less is NTP's own jitter.
CLOCK_SLACK_S = 2.0
_RESTORE = "restore the latest snapshot: `blazar restore PATH` (`blazar snapshot` makes them)"
_NOT_RESTORE = ("do not restore a snapshot: that would drop every event recorded after it, and a full disk is not a "
                "damaged log")


def log_checks(db: Path, *, now: float, quick: bool = False) -> list[Check]:
    """Integrity (`quick`: PRAGMA quick_check, which skips the indexes), seq, triggers, schema and clock; one failing
    check where the file cannot be read at all."""
    if not db.exists():
        return [ok("log", "database", f"no log yet at {db}: the first command creates it")]
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)) as conn:
            checks = [_integrity(conn, db, "quick_check" if quick else "integrity_check")]
            if checks[0].status == "fail":
                return checks
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='events'").fetchone() is None:
                return [*checks, _schema(db)]
            return [*checks, _seq(conn), _triggers(conn), _schema(db), _clock(conn, now)]
    except sqlite3.DatabaseError as e:
        if no_space(e, db.parent):
            return [_while_full(db, e, "quick_check" if quick else "integrity_check")]
        return [Check("log", "integrity", "fail", f"{db} cannot be read as SQLite: {e}", fix=_RESTORE)]


def _while_full(db: Path, error: sqlite3.DatabaseError, pragma: str) -> Check:
    """The log SQLite could not open for want of space, checked as it stands on disk."""
    room = space(db.parent)
    free = (f"free space on {room.mount} (at least {size(LOG_HEADROOM_BYTES)}), then run `blazar doctor` again; "
            + _NOT_RESTORE)
    seen = f"the disk under {db.parent} is full ({room.describe()}), so SQLite cannot open {db} in place ({error})"
    try:
        wal = db.with_name(db.name + "-wal").stat().st_size
    except OSError:
        wal = 0
    unchecked = f"; its WAL ({size(wal)} of recent commits) is applied once there is room" if wal else ""
    try:
        # NOTE: immutable=1: no WAL index to create, no lock to take; the database file alone, as it is on disk.
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)) as conn:
            rows = [str(r[0]) for r in conn.execute(f"PRAGMA {pragma}(20)").fetchall()]
    except sqlite3.DatabaseError as e:
        return Check("log", "integrity", "warn", f"{seen}; read as it stands on disk it could not be checked either "
                     f"({e})", fix=free)
    if rows == ["ok"]:
        return Check("log", "integrity", "warn", f"{seen}. Read as it stands on disk, PRAGMA {pragma}: ok: the log "
                     f"is intact{unchecked}", fix=free)
    return Check("log", "integrity", "fail", f"{seen}. Read as it stands on disk, PRAGMA {pragma} found "
                 f"{len(rows)} problem(s): " + "; ".join(rows[:3]) + " (the database file alone, while the disk is "
                 "full: check again once there is room)", fix=f"free space on {room.mount}, then run `blazar doctor` "
                 "again before restoring anything (a restore drops every event recorded after the snapshot)")


def _integrity(conn: sqlite3.Connection, db: Path, pragma: str) -> Check:
    rows = [str(r[0]) for r in conn.execute(f"PRAGMA {pragma}(20)").fetchall()]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    if rows == ["ok"]:
        return ok("log", "integrity", f"PRAGMA {pragma}: ok ({pages} pages in {db})")
    return Check("log", "integrity", "fail", f"PRAGMA {pragma} found {len(rows)} problem(s): "
                 + "; ".join(rows[:3]), fix=_RESTORE)


def _seq(conn: sqlite3.Connection) -> Check:
    """Seq 1..last whole, the archived ranges counted (blazar/operations/doctor/seqcheck.py)."""
    count, last = conn.execute("SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM events").fetchone()
    has_archived = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='archived'").fetchone()
    ranges = conn.execute("SELECT first_seq, last_seq, count FROM archived").fetchall() if has_archived else []
    facts = seqcheck.SeqFacts(count=count, last=last, ranges=[tuple(r) for r in ranges])
    live_in = sum(conn.execute("SELECT COUNT(*) FROM events WHERE seq BETWEEN ? AND ?", span).fetchone()[0]
                  for span in facts.union())
    gaps = None
    if not seqcheck.whole(facts, live_in):
        gaps = conn.execute(seqcheck.gaps_sql(has_archived=bool(has_archived)),
                            (last, len(ranges) + seqcheck.GAPS_READ)).fetchall()
    return seqcheck.verdict(facts, live_in, gaps)


def _triggers(conn: sqlite3.Connection) -> Check:
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger' AND tbl_name='events'")}
    missing = [t for t in TRIGGERS if t not in have]
    if not missing:
        return ok("log", "triggers", "append-only triggers present: " + ", ".join(TRIGGERS))
    return Check("log", "triggers", "fail", f"missing trigger(s) {', '.join(missing)}: the log no longer refuses "
                 "UPDATE, DELETE or a gap", fix=_RESTORE + " (or recreate them as migrations/versions/"
                 "0001_event_log.py does)")


def _schema(db: Path) -> Check:
    try:
        st = migrate.status(db)
    except BlazarError as e:
        return Check("log", "schema", "fail", e.message, fix="upgrade Blazar to the version that wrote this log")
    if st.up_to_date:
        return ok("log", "schema", f"schema at head ({st.head})")
    return Check("log", "schema", "warn", f"schema at {st.current or 'none'}, head is {st.head} "
                 f"({len(st.pending)} migration(s) pending)", fix="blazar db upgrade")


def _clock(conn: sqlite3.Connection, now: float) -> Check:
    row = conn.execute("SELECT ts, seq FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    if row is None:
        return ok("log", "clock", "no events to compare the clock with")
    last_ts, seq = float(row[0]), int(row[1])
    if now + CLOCK_SLACK_S >= last_ts:
        return ok("log", "clock", f"now is {now - last_ts:.0f} s after the last event (seq {seq})")
    return Check("log", "clock", "fail", f"the clock reads {last_ts - now:.0f} s before the last event (seq {seq}): "
                 "new events would be stamped earlier than old ones", fix="set the system clock (timedatectl "
                 "set-ntp true, or date -s), then run blazar again")
