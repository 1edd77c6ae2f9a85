"""The schema: Alembic scripts and the start-up fast path agree; a newer database is refused."""

from __future__ import annotations

import sqlite3

import pytest

from blazar.errors import SchemaOutOfDate
from blazar.events import migrate


def test_schema_head_constant_matches_the_migration_scripts(tmp_path) -> None:
    st = migrate.status(tmp_path / "new.db")
    assert st.head == migrate.SCHEMA_HEAD
    assert st.current is None and st.pending[0] == "0001" and st.pending[-1] == migrate.SCHEMA_HEAD


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
