"""The append-only event log and projection checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _postgresql()
        return
    # NOTE: `seq INTEGER PRIMARY KEY` is SQLite's rowid: uniqueness is the concurrency check, and the
    # insert trigger below makes every new seq exactly MAX(seq)+1, so the log is gap-free by construction.
    op.execute(
        """
        CREATE TABLE events (
            seq      INTEGER PRIMARY KEY,
            ts       REAL    NOT NULL,
            type     TEXT    NOT NULL,
            v        INTEGER NOT NULL,
            stream   TEXT    NOT NULL,
            trace_id TEXT,
            actor    TEXT    NOT NULL,
            cause    INTEGER,
            data     TEXT    NOT NULL
        )
        """
    )
    op.execute("CREATE INDEX ix_events_type ON events (type, seq)")
    op.execute("CREATE INDEX ix_events_stream ON events (stream, seq)")
    op.execute("CREATE INDEX ix_events_trace ON events (trace_id, seq) WHERE trace_id IS NOT NULL")
    op.execute("CREATE INDEX ix_events_ts ON events (ts)")
    op.execute(
        """
        CREATE TRIGGER events_no_update BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'blazar: the event log is append-only (UPDATE refused)'); END
        """
    )
    op.execute(
        """
        CREATE TRIGGER events_no_delete BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'blazar: the event log is append-only (DELETE refused)'); END
        """
    )
    op.execute(
        """
        CREATE TRIGGER events_gap_free BEFORE INSERT ON events
        WHEN NEW.seq IS NOT (SELECT COALESCE(MAX(seq), 0) + 1 FROM events)
        BEGIN SELECT RAISE(ABORT, 'blazar: seq must be MAX(seq)+1 (the log is gap-free)'); END
        """
    )
    # Derived data, rebuilt at will: a projection's folded state as of `seq`.
    op.execute(
        """
        CREATE TABLE checkpoints (
            name    TEXT PRIMARY KEY,
            version INTEGER NOT NULL,
            seq     INTEGER NOT NULL,
            anchor  TEXT    NOT NULL,
            state   TEXT    NOT NULL,
            sha256  TEXT    NOT NULL,
            ts      REAL    NOT NULL
        )
        """
    )


def _postgresql() -> None:
    """The same log on PostgreSQL: the same columns, indexes and guarantees. Appends serialise on an advisory lock
    (blazar/events/log_pg.py) and take MAX(seq)+1 under it; the insert trigger refuses any other seq, the primary
    key any duplicate, and the update/delete/truncate triggers any rewrite of history."""
    op.execute(
        """
        CREATE TABLE events (
            seq      BIGINT           PRIMARY KEY,
            ts       DOUBLE PRECISION NOT NULL,
            type     TEXT             NOT NULL,
            v        INTEGER          NOT NULL,
            stream   TEXT             NOT NULL,
            trace_id TEXT,
            actor    TEXT             NOT NULL,
            cause    BIGINT,
            data     TEXT             NOT NULL
        )
        """
    )
    op.execute("CREATE INDEX ix_events_type ON events (type, seq)")
    op.execute("CREATE INDEX ix_events_stream ON events (stream, seq)")
    op.execute("CREATE INDEX ix_events_trace ON events (trace_id, seq) WHERE trace_id IS NOT NULL")
    op.execute("CREATE INDEX ix_events_ts ON events (ts)")
    op.execute(
        """
        CREATE FUNCTION blazar_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'blazar: the event log is append-only (% refused)', TG_OP
                USING ERRCODE = 'integrity_constraint_violation';
        END $$
        """
    )
    op.execute("CREATE TRIGGER events_no_update BEFORE UPDATE ON events FOR EACH ROW "
               "EXECUTE FUNCTION blazar_events_append_only()")
    op.execute("CREATE TRIGGER events_no_delete BEFORE DELETE ON events FOR EACH ROW "
               "EXECUTE FUNCTION blazar_events_append_only()")
    op.execute("CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events FOR EACH STATEMENT "
               "EXECUTE FUNCTION blazar_events_append_only()")
    op.execute(
        """
        CREATE FUNCTION blazar_events_gap_free() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.seq IS DISTINCT FROM (SELECT COALESCE(MAX(seq), 0) + 1 FROM events) THEN
                RAISE EXCEPTION 'blazar: seq must be MAX(seq)+1 (the log is gap-free)'
                    USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    op.execute("CREATE TRIGGER events_gap_free BEFORE INSERT ON events FOR EACH ROW "
               "EXECUTE FUNCTION blazar_events_gap_free()")
    op.execute(
        """
        CREATE TABLE checkpoints (
            name    TEXT             PRIMARY KEY,
            version INTEGER          NOT NULL,
            seq     BIGINT           NOT NULL,
            anchor  TEXT             NOT NULL,
            state   TEXT             NOT NULL,
            sha256  TEXT             NOT NULL,
            ts      DOUBLE PRECISION NOT NULL
        )
        """
    )


def downgrade() -> None:
    raise RuntimeError("the event log is never downgraded: restore a snapshot instead")
