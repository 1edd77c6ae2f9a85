"""The schema: Alembic scripts and the start-up fast path agree; a newer database is refused."""

from __future__ import annotations

import sqlite3

import pytest

from blazar.errors import SchemaOutOfDate
from blazar.events import migrate


def test_schema_head_constant_matches_the_migration_scripts(tmp_path) -> None:
    st = migrate.status(tmp_path / "new.db")
    assert st.head == migrate.SCHEMA_HEAD
    assert st.current is None and st.pending[-1] == migrate.SCHEMA_HEAD and st.pending[0] == "0001"


def test_upgrade_creates_the_schema_once(tmp_path) -> None:
    db = tmp_path / "b.db"
    before = migrate.upgrade(db)
    assert before.current is None
    assert migrate.current_revision(db) == migrate.SCHEMA_HEAD
    assert migrate.upgrade(db).up_to_date
    conn = sqlite3.connect(db)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert {"events", "checkpoints", "events_no_update", "events_no_delete", "events_gap_free"} <= names


def test_a_database_from_a_newer_blazar_is_refused(tmp_path) -> None:
    db = tmp_path / "b.db"
    migrate.upgrade(db)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.close()
    with pytest.raises(SchemaOutOfDate, match="written by a newer version"):
        migrate.ensure_schema(db)


def test_two_processes_starting_on_a_new_home_both_succeed(tmp_path) -> None:
    import subprocess
    import sys

    db = tmp_path / "b.db"
    code = f"from blazar.events import migrate; from pathlib import Path; migrate.ensure_schema(Path({str(db)!r}))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    assert migrate.current_revision(db) == migrate.SCHEMA_HEAD


def test_a_log_from_before_archiving_upgrades_keeping_its_events_and_guards_deletes(tmp_path) -> None:
    """0001 -> 0002: the events stay; DELETE is still refused unless an archived range covers request history."""
    from alembic import command
    from sqlalchemy import create_engine

    db = tmp_path / "old.db"
    cfg, _ = migrate._script_directory()
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
    engine.dispose()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("INSERT INTO events (seq, ts, type, v, stream, trace_id, actor, cause, data) VALUES "
                     "(1, 1.0, 'request.received', 1, 'trace:t', 't', 'gw', NULL, '{}')")
    conn.close()
    assert migrate.upgrade(db).current == "0001"
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 1
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("DELETE FROM events")
        with conn:
            conn.execute("INSERT INTO archived VALUES (1, 'seg-000001-1-1', 1, 1, 1, 'x', 2)")
            conn.execute("DELETE FROM events WHERE seq = 1")  # request history inside an archived range
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0
    finally:
        conn.close()


def test_the_delete_trigger_knows_exactly_the_archivable_types() -> None:
    """The schema's guard (0002: `request.*` and `node.heartbeat`) and the event classes' ARCHIVABLE agree."""
    import blazar.events  # noqa: F401  (registers every type)
    from blazar.events.archive import archivable_types
    from blazar.events.types import known_types

    guarded = [t for t in known_types() if t.startswith("request.") or t == "node.heartbeat"]
    assert archivable_types() == guarded
