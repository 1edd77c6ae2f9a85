"""The snapshot verifier: what a restore checks before it trusts a snapshot, one refusal at a time."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from blazar.context import Blazar
from blazar.errors import SnapshotError
from blazar.operations.config import set_value
from blazar.operations.snapshot import take_snapshot
from blazar.operations.snapshot_verify import (
    ModelFile,
    check_model_files,
    list_model_files,
    verify_snapshot,
)


@pytest.fixture
async def snap(app: Blazar, tmp_path: Path) -> Path:
    await set_value(app, "telemetry.log_level", "info")
    await set_value(app, "telemetry.pii_scrub", "false")
    await take_snapshot(app, tmp_path / "snap")
    return tmp_path / "snap"


def _manifest(snap: Path) -> dict[str, Any]:
    return orjson.loads((snap / "manifest.json").read_bytes())


def _write_manifest(snap: Path, doc: Any) -> None:
    (snap / "manifest.json").write_bytes(orjson.dumps(doc))


def _reseal(snap: Path, **claims: Any) -> None:
    """Rewrite the manifest so size and sha256 match the db as it now is, with `claims` on top."""
    db = snap / "blazar.db"
    data = db.read_bytes()
    _write_manifest(snap, {**_manifest(snap), "db_bytes": len(data),
                           "db_sha256": hashlib.sha256(data).hexdigest(), **claims})


def _edit_db(snap: Path, *sql: str) -> None:
    conn = sqlite3.connect(snap / "blazar.db", isolation_level=None)
    try:
        for statement in sql:
            conn.execute(statement)
    finally:
        conn.close()


def _refused(source: Path) -> str:
    with pytest.raises(SnapshotError) as info:
        verify_snapshot(source)
    return info.value.message


def test_a_fresh_snapshot_verifies_and_verifying_writes_nothing(snap: Path) -> None:
    before = sorted((p.name, p.stat().st_mtime_ns) for p in snap.iterdir())
    verified = verify_snapshot(snap)
    assert verified.manifest.seq_last == verified.manifest.event_count == 2
    assert verified.manifest.counts_by_type == {"config.changed": 2}
    assert verified.manifest_sha256 == hashlib.sha256((snap / "manifest.json").read_bytes()).hexdigest()
    assert verify_snapshot(snap / "manifest.json").db == snap / "blazar.db"
    assert sorted((p.name, p.stat().st_mtime_ns) for p in snap.iterdir()) == before  # no -wal, -shm, journal


def test_a_missing_path_or_a_directory_without_manifest_is_refused(tmp_path: Path) -> None:
    assert _refused(tmp_path / "nowhere") == f"no snapshot at {tmp_path / 'nowhere'}"
    assert _refused(tmp_path) == f"not a Blazar snapshot: {tmp_path} has no manifest.json"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (b"\x00\xff not json", "is not a JSON manifest"),
        ([1, 2, 3], "is not a blazar-snapshot manifest"),
        ({"format": "tarball"}, "is not a blazar-snapshot manifest"),
        ({"format": "blazar-snapshot", "format_version": 2}, "snapshot format version 2 is not supported"),
        ({"format": "blazar-snapshot", "format_version": 1}, "damaged manifest"),
    ],
)
def test_a_foreign_or_unsupported_manifest_is_refused(snap: Path, doc: Any, message: str) -> None:
    if isinstance(doc, bytes):
        (snap / "manifest.json").write_bytes(doc)
    else:
        _write_manifest(snap, doc)
    assert message in _refused(snap)


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"db_sha256": "not-hex"}, "damaged manifest"),
        ({"db_file": "../blazar.db"}, "db_file: Value error, must be a file name inside the snapshot"),
        ({"models": [{"path": "../../etc/passwd", "bytes": 1, "sha256": "0" * 64}]}, "must be a relative path"),
        ({"seq_last": -1}, "seq_last"),
        ({"surprise": True}, "surprise: Extra inputs are not permitted"),
    ],
)
def test_a_manifest_with_bad_fields_is_refused(snap: Path, claims: dict[str, Any], message: str) -> None:
    _write_manifest(snap, {**_manifest(snap), **claims})
    assert message in _refused(snap)


def test_a_missing_truncated_or_altered_copy_is_refused(snap: Path) -> None:
    db = snap / "blazar.db"
    data = db.read_bytes()
    flipped = bytes([data[-1] ^ 0xFF])
    db.write_bytes(data[:-1] + flipped)
    assert "the sha256 of" in _refused(snap) and "does not match the manifest" in _refused(snap)
    db.write_bytes(data[:100])
    assert f"is 100 bytes, the manifest says {len(data)} (truncated or altered)" in _refused(snap)
    db.unlink()
    assert _refused(snap) == f"damaged snapshot: {db} is missing"


def test_counts_that_differ_from_the_manifest_are_refused(snap: Path) -> None:
    _write_manifest(snap, {**_manifest(snap), "counts_by_type": {"config.changed": 1, "snapshot.taken": 1}})
    assert "does not match its manifest: counts_by_type is {'config.changed': 2}" in _refused(snap)
    _write_manifest(snap, {**_manifest(snap), "event_count": 3, "seq_last": 3})
    message = _refused(snap)
    assert "event_count is 2, the manifest says 3" in message and "seq_last is 2, the manifest says 3" in message


def test_a_file_that_is_not_sqlite_is_refused(snap: Path) -> None:
    (snap / "blazar.db").write_bytes(b"SQLite format 2\x00" + bytes(4080))
    _reseal(snap)
    assert "is not a readable SQLite database: file is not a database" in _refused(snap)


def test_a_truncated_copy_with_a_matching_manifest_is_refused_by_sqlite(snap: Path) -> None:
    db = snap / "blazar.db"
    db.write_bytes(db.read_bytes()[: 3 * 4096])
    _reseal(snap)
    assert "is not a readable SQLite database: database disk image is malformed" in _refused(snap)


def test_a_copy_that_fails_the_integrity_check_is_refused(snap: Path) -> None:
    db = snap / "blazar.db"
    with sqlite3.connect(f"{db.as_uri()}?mode=ro&immutable=1", uri=True) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'ix_events_ts'").fetchone()
    conn.close()
    data = bytearray(db.read_bytes())
    end = root * page_size
    data[end - 10 : end] = bytes(10)  # the tail of an index entry: the table still reads, the index lies
    db.write_bytes(data)
    _reseal(snap)
    message = _refused(snap)
    assert "fails SQLite's integrity check: " in message and "row 1 missing from index ix_events_ts" in message
    assert "***" not in message


def test_a_log_with_a_gap_is_refused(snap: Path) -> None:
    _edit_db(snap, "DROP TRIGGER events_no_delete", "DELETE FROM events WHERE seq = 1")
    _reseal(snap, event_count=1, seq_first=2, counts_by_type={"config.changed": 1})
    assert "the log has a gap (1 events between seq 2 and 2)" in _refused(snap)


def test_an_event_that_does_not_decode_is_refused(snap: Path) -> None:
    _edit_db(snap, "INSERT INTO events (seq, ts, type, v, stream, actor, data) "
                   "VALUES (3, 1.0, 'alien.landed', 1, 'system', 'test', '{}')")
    _reseal(snap, event_count=3, seq_last=3, counts_by_type={"alien.landed": 1, "config.changed": 2})
    assert "does not decode: seq 3: unknown event type 'alien.landed'" in _refused(snap)


def test_a_malformed_payload_is_refused(snap: Path) -> None:
    _edit_db(snap, "INSERT INTO events (seq, ts, type, v, stream, actor, data) "
                   "VALUES (3, 1.0, 'config.changed', 1, 'system', 'test', '{\"key\": 5}')")
    _reseal(snap, event_count=3, seq_last=3, counts_by_type={"config.changed": 3})
    assert "does not decode: seq 3: malformed 'config.changed' payload" in _refused(snap)


def test_a_schema_revision_this_code_does_not_know_is_refused(snap: Path) -> None:
    _edit_db(snap, "UPDATE alembic_version SET version_num = '9999'")
    _reseal(snap, schema_revision="9999")
    assert "schema revision '9999', which this Blazar does not know" in _refused(snap)


def test_model_files_are_listed_sorted_without_symlinks_and_checked(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "b").mkdir(parents=True)
    (models / "b" / "w.gguf").write_bytes(b"x" * 10)
    (models / "a.bin").write_bytes(b"")
    (models / "alias").symlink_to(models / "a.bin")
    listed = list_model_files(models)
    assert listed == [
        ModelFile(path="a.bin", bytes=0, sha256=hashlib.sha256(b"").hexdigest()),
        ModelFile(path="b/w.gguf", bytes=10, sha256=hashlib.sha256(b"x" * 10).hexdigest()),
    ]
    assert list_model_files(tmp_path / "absent") == []
    assert check_model_files(models, listed) == []

    (models / "b" / "w.gguf").write_bytes(b"x" * 3)
    (models / "a.bin").unlink()
    assert check_model_files(models, listed) == [
        f"model file a.bin is missing from {models}",
        "model file b/w.gguf is 3 bytes, the snapshot recorded 10",
    ]


# -- paths the log names ---------------------------------------------------------------------------------------------


async def test_a_log_naming_paths_outside_the_home_is_refused_naming_each_event(app: Blazar, tmp_path: Path) -> None:
    from blazar.events.engines import EngineActivated, EngineFile, EngineInstalled
    from blazar.events.models import ModelImported, ModelMetadata
    from tests.support.crafted import seal

    await set_value(app, "telemetry.log_level", "info")
    recs = await app.record([
        EngineInstalled(tag="evil", source_kind="path", source="/x", binary="../../../tmp/evil.sh",
                        files=[EngineFile(path="../../../tmp/evil.sh", bytes=1, sha256="ab" * 32)], version={},
                        manifest={}),
        EngineActivated(tag="evil", reason="use"),
        ModelImported(name="victim", path="/home/me/precious.txt", source="x", bytes=1, sha256="ab" * 32, linked=True,
                      metadata=ModelMetadata(architecture="llama")),
    ])
    snap = seal(app.paths, tmp_path / "gift")
    message = _refused(snap)
    assert message.startswith("the log names paths outside the home")
    assert f"seq {recs[0].seq} engine.installed: binary '../../../tmp/evil.sh' climbs out with '..'" in message
    assert f"seq {recs[2].seq} model.imported: path '/home/me/precious.txt' is absolute" in message
    assert f"seq {recs[1].seq} " not in message  # an activation names no path: its install is what is refused
    # Taking a snapshot of such a log fails the same way: a backup no restore would take is never written.
    with pytest.raises(SnapshotError, match="names paths outside the home"):
        await take_snapshot(app, tmp_path / "again")
    assert not (tmp_path / "again").exists()
