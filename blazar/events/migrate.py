"""Creating and upgrading the log's schema with Alembic (the `migrations/` scripts).

Start-up takes a fast path: when the database already stands at `SCHEMA_HEAD`, Alembic is not even imported.
A unit test keeps `SCHEMA_HEAD` equal to the scripts' head.
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from blazar.errors import SchemaOutOfDate
from blazar.events.location import LogLocation, SqliteFile

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

SCHEMA_HEAD = "0003"


def migrations_dir() -> Path:
    here = Path(__file__).resolve().parent.parent
    packaged = here / "_migrations"  # in a wheel (see pyproject's force-include)
    if packaged.is_dir():
        return packaged
    return here.parent / "migrations"  # a source checkout or an editable install


def current_revision(db: Path) -> str | None:
    """The revision the database stands at, or None for a new or empty file."""
    if not db.exists() or db.stat().st_size == 0:
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='alembic_version'"
        ).fetchone()
        if row is None:
            return None
        got = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        return got[0] if got else None
    finally:
        conn.close()


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    location: LogLocation
    current: str | None
    head: str
    pending: list[str]

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head


def _script_directory() -> tuple[Config, ScriptDirectory]:  # alembic is imported lazily: start-up cost
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return cfg, ScriptDirectory.from_config(cfg)


def status(db: Path) -> SchemaStatus:
    current = current_revision(db)
    _, scripts = _script_directory()
    head = scripts.get_current_head()
    assert head is not None
    known = {s.revision for s in scripts.walk_revisions()}
    if current is not None and current not in known:
        raise SchemaOutOfDate(
            f"{db} is at schema revision {current!r}, which this Blazar does not know: "
            "it was written by a newer version"
        )
    pending: list[str] = []
    for script in scripts.walk_revisions(base="base", head=head):
        if script.revision == current:
            break
        pending.append(script.revision)
    pending.reverse()
    return SchemaStatus(location=SqliteFile(db), current=current, head=head, pending=pending)


def upgrade(db: Path) -> SchemaStatus:
    """Run every pending migration (creating the schema on a new file). Returns the status before."""
    from alembic import command
    from sqlalchemy import create_engine

    before = status(db)
    if before.up_to_date:
        return before
    cfg, _ = _script_directory()
    db.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")  # persistent: the log always runs in WAL mode
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()
    return before


def ensure_schema(db: Path) -> None:
    """Start-up hook: upgrade when needed, cheaply skip when already at head.

    Two processes starting on a new home at once must not both run the migrations: a lock file serialises
    them, and the second finds the schema at head once it has the lock.
    """
    if current_revision(db) == SCHEMA_HEAD:
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".migrate.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if current_revision(db) != SCHEMA_HEAD:
            upgrade(db)
