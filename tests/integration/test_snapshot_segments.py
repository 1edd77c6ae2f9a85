"""Snapshots take the archive segments along, end to end through the real `blazar` command: the manifest lists
each segment file the log names, a restore (into the same home or a new one) puts them in the archive directory and
every read answers as before; a snapshot whose segment is missing or altered is refused, changing nothing."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest

from blazar.clock import FakeClock
from blazar.errors import SnapshotError
from blazar.operations.snapshot_verify import inspect_log
from blazar.paths import Paths
from tests.conftest import Cli
from tests.support.archived import reads, seed_archived


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
async def archived_home(paths: Paths, clock: FakeClock) -> list[str]:
    segs = await seed_archived(paths, clock)
    return [s.name for s in segs]


def test_a_snapshot_carries_the_segments_and_a_restore_puts_them_in_place(
        cli: Cli, paths: Paths, tmp_path: Path, archived_home: list[str]) -> None:
    before = reads(cli)
    assert len(before["all"]) == 12  # type: ignore[arg-type]
    snap = tmp_path / "snap"
    manifest = cli("snapshot", str(snap), "--json").json()
    names = sorted(f"{n}{s}" for n in archived_home for s in (".jsonl.gz", ".manifest.json"))
    assert sorted(f["name"] for f in manifest["segments"]) == names
    for f in manifest["segments"]:
        assert f["sha256"] == _sha(snap / "archive" / f["name"]) == _sha(paths.archive / f["name"])

    # Into a new home: the segments arrive in its archive directory and every read answers as before.
    other = Cli(tmp_path / "other")
    other.home.mkdir()
    res = other("restore", str(snap), "--json").json()
    assert res["warnings"] == []
    other_archive = Paths.from_env({"BLAZAR_HOME": str(other.home)}).archive
    assert sorted(p.name for p in other_archive.iterdir() if p.name.endswith((".gz", ".json"))) == names
    assert reads(other) == before
    assert other("audit", "verify", "--archive").stdout.startswith("ok: 3 segments, 12 events")

    # Into the same home whose archive lost a segment and gained a stray one: put back; the stray kept aside.
    (paths.archive / f"{archived_home[1]}.jsonl.gz").unlink()
    stray = paths.archive / "seg-000009-900-901.jsonl.gz"
    stray.write_bytes(b"not ours")
    res = cli("restore", str(snap), "--json").json()
    assert any("replaced-" in w for w in res["warnings"])
    assert not stray.exists()
    assert [p.read_bytes() for p in paths.archive.glob("replaced-*/seg-000009-900-901.jsonl.gz")] == [b"not ours"]
    assert reads(cli) == before
    assert cli("audit", "verify", "--archive").stdout.startswith("ok: 3 segments")


def test_a_snapshot_with_a_missing_or_altered_segment_is_refused(
        cli: Cli, paths: Paths, tmp_path: Path, archived_home: list[str]) -> None:
    snap = tmp_path / "snap"
    cli("snapshot", str(snap))
    db_before = _sha(paths.db)
    seg = archived_home[2]
    data = snap / "archive" / f"{seg}.jsonl.gz"
    kept = data.read_bytes()

    data.unlink()
    res = cli("restore", str(snap), check=False)
    assert res.code != 0 and f"archive segment {seg} (seq " in res.stderr and "is missing" in res.stderr

    data.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))
    res = cli("restore", str(snap), check=False)
    assert res.code != 0 and "does not match the manifest (truncated or altered)" in res.stderr

    # Altered and the snapshot's manifest resealed to match: the sha256 log.archived pinned still refuses it.
    doc = orjson.loads((snap / "manifest.json").read_bytes())
    for f in doc["segments"]:
        if f["name"] == data.name:
            f["sha256"], f["bytes"] = _sha(data), data.stat().st_size
    (snap / "manifest.json").write_bytes(orjson.dumps(doc))
    res = cli("restore", str(snap), check=False)
    assert res.code != 0 and "is not the file the log recorded for segment" in res.stderr
    assert _sha(paths.db) == db_before and not list(paths.archive.glob(".restore-*"))


def test_taking_a_snapshot_refuses_a_missing_or_altered_segment(
        cli: Cli, paths: Paths, tmp_path: Path, archived_home: list[str]) -> None:
    data = paths.archive / f"{archived_home[0]}.jsonl.gz"
    moved = tmp_path / "moved.gz"
    shutil.move(data, moved)
    res = cli("snapshot", str(tmp_path / "s1"), check=False)
    assert res.code != 0 and f"archive segment {archived_home[0]} (seq 1.." in res.stderr
    assert not (tmp_path / "s1").exists()
    raw = moved.read_bytes()
    data.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    res = cli("snapshot", str(tmp_path / "s2"), check=False)
    # Refused before a byte is copied (opening the home reads across it) or while copying: either names it.
    assert res.code != 0 and archived_home[0] in res.stderr
    assert "altered" in res.stderr or "is not the file the log recorded" in res.stderr
    assert not (tmp_path / "s2").exists()


def test_a_gap_the_archived_ranges_do_not_explain_is_still_refused(
        cli: Cli, paths: Paths, tmp_path: Path, archived_home: list[str]) -> None:
    snap = tmp_path / "snap"
    cli("snapshot", str(snap))
    facts = inspect_log(snap / "blazar.db")  # gaps inside the archived ranges: accepted
    assert facts.seq_first >= 1 and facts.event_count < facts.seq_last
    copy = tmp_path / "gap.db"
    shutil.copyfile(snap / "blazar.db", copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("DROP TRIGGER events_no_delete")
        conn.execute("DELETE FROM events WHERE seq = (SELECT MAX(seq) - 1 FROM events)")
    with pytest.raises(SnapshotError, match=r"the log has a gap .*archived ranges cover 1\.\.16"):
        inspect_log(copy)
