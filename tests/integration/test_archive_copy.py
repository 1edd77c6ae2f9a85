"""An archived log copied to another store keeps its archive, end to end through the real `blazar` command:
`blazar db migrate-to` (SQLite → PostgreSQL), a snapshot restored onto PostgreSQL and a snapshot of a PostgreSQL log
carry the `archived` ranges and the live rows with the gaps they explain; every read answers as before and the
archive verifies. The insert trigger still refuses any other gap."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from blazar.clock import FakeClock
from blazar.paths import Paths
from tests.conftest import Cli
from tests.support.archived import reads, seed_archived
from tests.support.postgres import cluster


@pytest.fixture
def pg_url() -> str:
    return cluster().new_database()


def _live_seqs(paths: Paths) -> list[int]:
    with sqlite3.connect(f"{paths.db.as_uri()}?mode=ro", uri=True) as conn:
        return [r[0] for r in conn.execute("SELECT seq FROM events ORDER BY seq")]


async def test_an_archived_sqlite_log_still_refuses_a_gap_it_does_not_explain(paths: Paths, clock: FakeClock) -> None:
    await seed_archived(paths, clock)
    top = _live_seqs(paths)[-1]
    with sqlite3.connect(paths.db) as conn, pytest.raises(sqlite3.IntegrityError, match="gap-free"):
        conn.execute("INSERT INTO events (seq, ts, type, v, stream, actor, data) "
                     "VALUES (?, 0, 'config.changed', 1, 'x', 'a', '{}')", (top + 2,))


async def test_migrate_to_postgresql_takes_the_archived_ranges_along(cli: Cli, paths: Paths, clock: FakeClock,
                                                                     pg_url: str, tmp_path: Path) -> None:
    await seed_archived(paths, clock)
    before = reads(cli)
    live = _live_seqs(paths)
    done = cli("db", "migrate-to", pg_url, "--json").json()
    assert done["events"] == len(live)
    cli.env["BLAZAR_DATABASE_URL"] = pg_url
    assert cli("db", "status", "--json").json()["events"] == len(live)
    assert reads(cli) == before
    assert cli("audit", "verify", "--archive").stdout.startswith("ok: 3 segments, 12 events")

    # A snapshot of the PostgreSQL log carries its ranges and segments; restored into a new SQLite home it reads
    # the same.
    snap = tmp_path / "snap"
    manifest = cli("snapshot", str(snap), "--json").json()
    assert len(manifest["segments"]) == 6
    other = Cli(tmp_path / "other")
    other.home.mkdir()
    other("restore", str(snap))
    assert reads(other) == before
    assert other("audit", "verify", "--archive").stdout.startswith("ok: 3 segments")


async def test_a_snapshot_restored_onto_postgresql_keeps_its_archive(cli: Cli, paths: Paths, clock: FakeClock,
                                                                    pg_url: str, tmp_path: Path) -> None:
    await seed_archived(paths, clock)
    before = reads(cli)
    snap = tmp_path / "snap"
    cli("snapshot", str(snap))
    other = Cli(tmp_path / "other")
    other.home.mkdir()
    other.env["BLAZAR_DATABASE_URL"] = pg_url
    other("restore", str(snap))
    assert reads(other) == before
    assert other("audit", "verify", "--archive").stdout.startswith("ok: 3 segments, 12 events")
