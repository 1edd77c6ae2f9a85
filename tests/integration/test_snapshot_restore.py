"""`blazar snapshot` and `blazar restore` end to end through the real `blazar` command: the round trip, the
refusals that leave the current log untouched, the daemon lock, an online copy under appends, model files."""

from __future__ import annotations

import copy
import os
import random
import re
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import orjson
import pytest

from blazar import config, runlock
from blazar.events.base import Recorded
from blazar.events.types import decode
from blazar.operations.snapshot_verify import verify_snapshot
from blazar.paths import Paths
from blazar.projections import all_projections
from blazar.projections.codec import codec_for
from tests.conftest import Cli
from tests.support.snapshots import EXIT_SNAPSHOT_REFUSED, change_config, fingerprint, seed_and_snapshot, sha

EXIT_DAEMON_RUNNING = 4


def _plus_event(state: dict[str, Any], line: dict[str, Any]) -> dict[str, Any]:
    """`state` (as `blazar state --json` prints it) with one more event folded in, by the projections' own code."""
    rec = Recorded(
        seq=line["seq"], ts=line["ts"], type=line["type"], v=line["v"], stream=line["stream"],
        trace_id=line["trace_id"], actor=line["actor"], cause=line["cause"],
        event=decode(line["seq"], line["type"], line["v"], orjson.dumps(line["data"])),
    )
    expected = copy.deepcopy(state)
    for p in all_projections():
        if p.wants(rec.type):
            # Every projection that folds this event shows its state as is (view == the codec's JSON of it).
            codec = codec_for(p.state_type)
            state = expected["projections"][p.name]
            expected["projections"][p.name] = codec.jsonable(p.apply(codec.load(orjson.dumps(state)), rec))
    expected["seq"] = rec.seq
    return expected


# -- the round trip -------------------------------------------------------------------------------------------


def test_snapshot_then_restore_gives_an_identical_state(cli: Cli, paths: Paths, tmp_path: Path) -> None:
    change_config(paths, {"telemetry.log_level": "info", "log.checkpoint_every": "500"})
    state_a = cli("state", "--json").json()
    snap = tmp_path / "snap"

    manifest = cli("snapshot", str(snap), "--json").json()
    assert manifest["path"] == str(snap)
    assert (manifest["seq_first"], manifest["seq_last"], manifest["event_count"]) == (1, state_a["seq"], 2)
    assert manifest["counts_by_type"] == {"config.changed": 2}
    assert "segments" not in manifest  # nothing archived: readable by a Blazar from before archive segments
    assert manifest["db_sha256"] == sha(snap / "blazar.db")
    assert orjson.loads((snap / "manifest.json").read_bytes()) == {k: v for k, v in manifest.items() if k != "path"}

    change_config(paths, {"telemetry.log_level": "debug", "log.checkpoint_every": None})
    restored = cli("restore", str(snap), "--json").json()
    assert restored["seq_last"] == state_a["seq"] and restored["seq"] == state_a["seq"] + 1
    # The replaced log (2 changes, snapshot.taken, 2 more changes) is kept whole beside the restored one.
    assert restored["previous_seq_last"] == 5 and restored["config_rewritten"] is True
    kept = Path(restored["previous_kept_at"])
    assert kept.parent == paths.data_dir and kept.name.startswith("blazar.db.replaced-")
    with sqlite3.connect(f"{kept.as_uri()}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT COUNT(*), MAX(seq) FROM events").fetchone() == (5, 5)
    assert tomllib.loads(paths.config_file.read_text()) == config.nest(state_a["projections"]["config"]["overrides"])

    assert cli("state", "--json", "--at", str(manifest["seq_last"])).json() == state_a
    after = cli("events", "--json", "--after", str(state_a["seq"])).json_lines()
    assert [e["type"] for e in after] == ["snapshot.restored"]
    assert after[0]["data"]["path"] == str(snap) and after[0]["data"]["previous_seq_last"] == 5
    assert after[0]["data"]["manifest_sha256"] == sha(snap / "manifest.json")
    now = cli("state", "--json").json()
    assert now["projections"]["config"] == state_a["projections"]["config"]
    assert now == _plus_event(state_a, after[0])


def test_restore_replaces_a_log_that_is_itself_damaged(cli: Cli, paths: Paths, tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    seed_and_snapshot(paths, snap)
    junk = random.Random(7).randbytes(8192)
    paths.db.write_bytes(junk)

    restored = cli("restore", str(snap), "--json").json()
    assert restored["previous_seq_last"] == 0
    kept = Path(restored["previous_kept_at"])
    assert kept.name.endswith("-unreadable") and kept.read_bytes() == junk
    assert cli("state", "--json").json()["projections"]["stats"]["by_type"] == {
        "config.changed": 2, "snapshot.restored": 1,
    }


# -- refusals -------------------------------------------------------------------------------------------------


def _truncated(paths: Paths, tmp: Path) -> Path:
    snap = tmp / "snap"
    seed_and_snapshot(paths, snap)
    db = snap / "blazar.db"
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    return snap


def _random_file(paths: Paths, tmp: Path) -> Path:
    seed_and_snapshot(paths, None)
    junk = tmp / "snapshot.bin"
    junk.write_bytes(random.Random(1).randbytes(4096))
    return junk


def _random_manifest(paths: Paths, tmp: Path) -> Path:
    snap = tmp / "snap"
    seed_and_snapshot(paths, snap)
    (snap / "manifest.json").write_bytes(random.Random(2).randbytes(512))
    return snap


def _foreign_db(paths: Paths, tmp: Path) -> Path:
    """A SQLite file that is not a Blazar log, with a hand-made manifest whose size and sha256 match it."""
    seed_and_snapshot(paths, None)
    snap = tmp / "foreign"
    snap.mkdir()
    db = snap / "blazar.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("INSERT INTO notes (body) VALUES ('hello')")
    conn.close()
    manifest = {
        "format": "blazar-snapshot", "format_version": 1, "created_at": "2026-12-02T00:00:00Z",
        "blazar_version": "0.1.0", "schema_revision": "0001", "seq_first": 1, "seq_last": 1, "event_count": 1,
        "counts_by_type": {"config.changed": 1}, "db_file": "blazar.db", "db_bytes": db.stat().st_size,
        "db_sha256": sha(db), "models": [],
    }
    (snap / "manifest.json").write_bytes(orjson.dumps(manifest))
    return snap


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_truncated, "damaged snapshot"),
        (_random_file, "not a Blazar snapshot"),
        (_random_manifest, "not a Blazar snapshot"),
        (_foreign_db, "is not a Blazar log: it has no events table"),
    ],
    ids=["truncated-db", "random-file", "random-manifest", "foreign-db"],
)
def test_a_damaged_or_foreign_snapshot_is_refused_and_changes_nothing(
    cli: Cli, paths: Paths, tmp_path: Path, make: Any, message: str
) -> None:
    source = make(paths, tmp_path)
    before_state = cli("state", "--json").json()
    before = fingerprint(paths)

    res = cli("restore", str(source), check=False)

    assert res.code == EXIT_SNAPSHOT_REFUSED, res.stderr
    assert message in res.stderr and res.stdout == ""
    assert fingerprint(paths) == before
    assert cli("state", "--json").json() == before_state


def test_restore_refuses_a_live_daemon_unless_forced(cli: Cli, paths: Paths, tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    seed_and_snapshot(paths, snap)
    before = fingerprint(paths)
    # flock belongs to this process's open file: the `blazar` child sees a live holder, with our pid.
    with runlock.hold(paths.daemon_lock):
        res = cli("restore", str(snap), check=False)
        assert res.code == EXIT_DAEMON_RUNNING
        assert f"a Blazar daemon (pid {os.getpid()}) is running; stop it or pass --force" in res.stderr
        assert fingerprint(paths) == before

        forced = cli("restore", str(snap), "--force", "--json").json()
    assert forced["forced"] is True
    assert any("running daemon" in w for w in forced["warnings"])
    (event,) = cli("events", "--json", "--type", "snapshot.restored").json_lines()
    assert event["data"]["forced"] is True


# -- taking snapshots -------------------------------------------------------------------------------------------

_WRITER = """
import asyncio, sys
from pathlib import Path
from blazar.events.log_sqlite import SqliteEventLog
from blazar.events.system import ConfigChanged

async def main(db, stop):
    log = await SqliteEventLog.open(Path(db))
    n = 0
    try:
        while not Path(stop).exists() and n < 50_000:
            await log.append([ConfigChanged(key="log_level")] * 5, actor="test:writer")
            n += 5
            if n == 50:
                print("ready", flush=True)
    finally:
        await log.close()
    print(n, flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_a_snapshot_taken_while_another_process_appends_is_consistent(
    cli: Cli, paths: Paths, tmp_path: Path
) -> None:
    paths.ensure()
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(paths.db), str(stop)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        manifest = cli("snapshot", str(tmp_path / "snap"), "--json").json()
    finally:
        stop.touch()
        out, _ = writer.communicate(timeout=30)
    assert writer.returncode == 0

    verified = verify_snapshot(tmp_path / "snap")  # integrity, gap-free seqs, every event decodes, counts
    assert verified.manifest.to_json() == {k: v for k, v in manifest.items() if k != "path"}
    assert manifest["seq_first"] == 1 and manifest["seq_last"] == manifest["event_count"] >= 50
    assert manifest["counts_by_type"] == {"config.changed": manifest["event_count"]}
    with sqlite3.connect(f"{paths.db.as_uri()}?mode=ro", uri=True) as conn:
        total = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    assert total == int(out.split()[-1]) + 1 > manifest["seq_last"]  # the writer's events + snapshot.taken


def test_the_manifest_lists_model_files_and_restore_warns_about_changed_ones(
    cli: Cli, paths: Paths, tmp_path: Path
) -> None:
    weights = paths.models / "org" / "tiny.gguf"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    notes = paths.models / "README"
    notes.write_text("tiny test model\n")
    (paths.models / "link.gguf").symlink_to(weights)  # not a regular file: not listed

    manifest = cli("snapshot", str(tmp_path / "snap"), "--json").json()
    assert manifest["models"] == [
        {"path": "README", "bytes": notes.stat().st_size, "sha256": sha(notes)},
        {"path": "org/tiny.gguf", "bytes": weights.stat().st_size, "sha256": sha(weights)},
    ]

    (paths.models / "link.gguf").unlink()
    weights.unlink()
    notes.write_text("edited\n")
    res = cli("restore", str(tmp_path / "snap" / "manifest.json"))
    assert "warning: model file org/tiny.gguf is missing" in res.stderr
    assert "warning: model file README is 7 bytes, the snapshot recorded 16" in res.stderr
    assert "restored" in res.stdout


def test_snapshot_defaults_to_the_snapshots_dir_and_refuses_a_used_path(
    cli: Cli, paths: Paths, tmp_path: Path
) -> None:
    manifest = cli("snapshot", "--json").json()
    where = Path(manifest["path"])
    assert where.parent == paths.snapshots
    assert re.fullmatch(r"blazar-\d{8}T\d{6}Z-seq0", where.name)
    assert manifest["event_count"] == 0 and (manifest["seq_first"], manifest["seq_last"]) == (0, 0)
    (taken,) = cli("events", "--json").json_lines()
    assert taken["type"] == "snapshot.taken" and taken["data"]["path"] == str(where)

    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    res = cli("snapshot", str(used), check=False)
    assert res.code == EXIT_SNAPSHOT_REFUSED
    assert "exists and is not an empty directory" in res.stderr
    assert sorted(p.name for p in used.iterdir()) == ["keep.txt"]
    assert not [p for p in (*tmp_path.iterdir(), *paths.snapshots.iterdir()) if p.name.endswith(".partial")]
