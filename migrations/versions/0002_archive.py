"""Archive segments: the `archived` table and the one guarded path that removes rows from `events`.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-05

A row may leave `events` only when it is request history (`request.*`, `node.heartbeat`: the types
`blazar.events.archive.archivable_types` names, a unit test keeps the two in step) and its seq lies in a range that
`archived` names (a segment written, re-read and verified, inserted in the same transaction as the `log.archived`
event that records it). A control event never leaves. `archived` is insert-only. UPDATE stays refused
everywhere, as does TRUNCATE on PostgreSQL. The gap-free insert trigger lets a copy skip the seqs archived ranges
hold.
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _postgresql()
        return
    op.execute(
        """
        CREATE TABLE archived (
            segment      INTEGER PRIMARY KEY,
            name         TEXT    NOT NULL UNIQUE,
            first_seq    INTEGER NOT NULL,
            last_seq     INTEGER NOT NULL,
            count        INTEGER NOT NULL,
            sha256       TEXT    NOT NULL,
            archived_seq INTEGER NOT NULL
        )
        """
    )
    op.execute("CREATE TRIGGER archived_no_update BEFORE UPDATE ON archived "
               "BEGIN SELECT RAISE(ABORT, 'blazar: the archive record is append-only (UPDATE refused)'); END")
    op.execute("CREATE TRIGGER archived_no_delete BEFORE DELETE ON archived "
               "BEGIN SELECT RAISE(ABORT, 'blazar: the archive record is append-only (DELETE refused)'); END")
    op.execute("DROP TRIGGER events_no_delete")
    # Gap-free still, across the archive: a copy of an archived log (a snapshot of a PostgreSQL log, `db
    # migrate-to`) inserts its live rows after its `archived` ranges, and the seqs those ranges hold are skipped.
    # Ranges run on from seq 1 without a hole, so "covered" is "at most the last archived seq".
    op.execute("DROP TRIGGER events_gap_free")
    op.execute(
        """
        CREATE TRIGGER events_gap_free BEFORE INSERT ON events
        WHEN NEW.seq IS NOT (SELECT COALESCE(MAX(seq), 0) + 1 FROM events)
          AND NOT (NEW.seq > (SELECT COALESCE(MAX(seq), 0) FROM events)
                   AND NEW.seq - 1 <= (SELECT COALESCE(MAX(last_seq), 0) FROM archived))
        BEGIN SELECT RAISE(ABORT, 'blazar: seq must be MAX(seq)+1 (the log is gap-free)'); END
        """
    )
    op.execute(
        """
        CREATE TRIGGER events_no_delete BEFORE DELETE ON events
        WHEN NOT (OLD.type GLOB 'request.*' OR OLD.type = 'node.heartbeat')
          OR NOT EXISTS (SELECT 1 FROM archived a WHERE OLD.seq BETWEEN a.first_seq AND a.last_seq)
        BEGIN SELECT RAISE(ABORT, 'blazar: the event log is append-only (DELETE refused outside an archived range)');
        END
        """
    )


def _postgresql() -> None:
    op.execute(
        """
        CREATE TABLE archived (
            segment      BIGINT PRIMARY KEY,
            name         TEXT   NOT NULL UNIQUE,
            first_seq    BIGINT NOT NULL,
            last_seq     BIGINT NOT NULL,
            count        BIGINT NOT NULL,
            sha256       TEXT   NOT NULL,
            archived_seq BIGINT NOT NULL
        )
        """
    )
    op.execute("CREATE TRIGGER archived_no_update BEFORE UPDATE ON archived FOR EACH ROW "
               "EXECUTE FUNCTION blazar_events_append_only()")
    op.execute("CREATE TRIGGER archived_no_delete BEFORE DELETE ON archived FOR EACH ROW "
               "EXECUTE FUNCTION blazar_events_append_only()")
    op.execute("CREATE TRIGGER archived_no_truncate BEFORE TRUNCATE ON archived FOR EACH STATEMENT "
               "EXECUTE FUNCTION blazar_events_append_only()")
    op.execute("DROP TRIGGER events_no_delete ON events")
    op.execute(
        """
        CREATE FUNCTION blazar_events_archived_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NOT (OLD.type LIKE 'request.%' OR OLD.type = 'node.heartbeat') OR NOT EXISTS (
                SELECT 1 FROM archived a WHERE OLD.seq BETWEEN a.first_seq AND a.last_seq) THEN
                RAISE EXCEPTION 'blazar: the event log is append-only (DELETE refused outside an archived range)'
                    USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN OLD;
        END $$
        """
    )
    op.execute("CREATE TRIGGER events_no_delete BEFORE DELETE ON events FOR EACH ROW "
               "EXECUTE FUNCTION blazar_events_archived_only()")
    op.execute(
        """
        CREATE OR REPLACE FUNCTION blazar_events_gap_free() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            top BIGINT := (SELECT COALESCE(MAX(seq), 0) FROM events);
        BEGIN
            IF NEW.seq IS DISTINCT FROM top + 1 AND NOT (
                NEW.seq > top AND NEW.seq - 1 <= (SELECT COALESCE(MAX(last_seq), 0) FROM archived)) THEN
                RAISE EXCEPTION 'blazar: seq must be MAX(seq)+1 (the log is gap-free)'
                    USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN NEW;
        END $$
        """
    )


def downgrade() -> None:
    raise RuntimeError("the event log is never downgraded: restore a snapshot instead")
