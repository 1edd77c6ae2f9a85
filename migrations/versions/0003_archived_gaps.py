"""A log copied with its archive: the insert trigger lets a seq jump over seqs the `archived` table names.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05

Copying a log to another store (`blazar db migrate-to`, a snapshot of a PostgreSQL log, a restore onto PostgreSQL)
writes its `archived` rows first, then its live rows as they are: with gaps where request history left for a
segment. The ranges run from seq 1, each after the one before, so they cover 1..their last seq: a new seq may be
MAX(seq)+1 as before, or skip seqs that all lie at or below the last archived seq. Appending is unchanged: the live
log's MAX(seq) is always past every archived range (the `log.archived` event comes after its range), so any seq but
MAX(seq)+1 is still refused.
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            """
            CREATE OR REPLACE FUNCTION blazar_events_gap_free() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE
                next_seq BIGINT := (SELECT COALESCE(MAX(seq), 0) + 1 FROM events);
            BEGIN
                IF NEW.seq IS DISTINCT FROM next_seq AND NOT (
                        NEW.seq > next_seq
                        AND NEW.seq - 1 <= (SELECT COALESCE(MAX(last_seq), 0) FROM archived)) THEN
                    RAISE EXCEPTION 'blazar: seq must be MAX(seq)+1 (the log is gap-free)'
                        USING ERRCODE = 'integrity_constraint_violation';
                END IF;
                RETURN NEW;
            END $$
            """
        )
        return
    op.execute("DROP TRIGGER events_gap_free")
    op.execute(
        """
        CREATE TRIGGER events_gap_free BEFORE INSERT ON events
        WHEN NEW.seq IS NOT (SELECT COALESCE(MAX(seq), 0) + 1 FROM events)
          AND NOT (NEW.seq > (SELECT COALESCE(MAX(seq), 0) + 1 FROM events)
                   AND NEW.seq - 1 <= (SELECT COALESCE(MAX(last_seq), 0) FROM archived))
        BEGIN SELECT RAISE(ABORT, 'blazar: seq must be MAX(seq)+1 (the log is gap-free)'); END
        """
    )


def downgrade() -> None:
    raise RuntimeError("the event log is never downgraded: restore a snapshot instead")
