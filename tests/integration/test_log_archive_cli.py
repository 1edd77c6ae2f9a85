"""`blazar log status` and `blazar log archive` end to end through the real `blazar` command on a home whose log was
seeded, through the Python API, with request history 40 days old: what status reports before and after, what a run
moves (and records), that `events --trace` still reads the archived traces, a retention of 0, a run refused because
another holds the archive, a failed run recorded as log.archive_failed, and `doctor` on a segment start-up cannot
read."""

from __future__ import annotations

import fcntl
import sqlite3
import time
from pathlib import Path

from tests.conftest import Cli
from tests.support.blazar_home import home_paths, seed_history

DAY_S = 86400.0


def test_status_then_archive_then_the_traces_still_read(cli: Cli) -> None:
    seed_history(cli.home, age_s=40 * DAY_S, traces=5)
    seed_history(cli.home, age_s=60, traces=1, prefix="new")
    before = cli("log", "status", "--json").json()
    assert before["live"]["events"] == 14 and before["archive"]["segments"] == []
    assert before["retention"]["request_retention"] == "30d" and before["retention"]["archivable_now"] == 10
    old_trace = cli("events", "--trace", "old-3", "--json").json_lines()
    assert [e["type"] for e in old_trace] == ["request.received", "request.completed"]

    done = cli("log", "archive", "--older-than", "30d", "--json").json()
    assert done["events"] == 10 and len(done["segments"]) == 1 and done["bytes"] > 0
    (seg,) = done["segments"]
    assert (seg["first_seq"], seg["count"]) == (1, 10)
    assert (cli.home / "archive" / f"{seg['name']}.jsonl.gz").is_file()
    (recorded,) = cli("events", "--type", "log.archived", "--json").json_lines()
    assert recorded["data"]["name"] == seg["name"] and recorded["actor"].startswith("cli:")

    # Gone from the live log, and read back from the segment all the same.
    with sqlite3.connect(home_paths(cli.home).db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM events WHERE trace_id = 'old-3'").fetchone()[0] == 0
        checkpoints = [r[0] for r in conn.execute("SELECT seq FROM checkpoints")]
    assert checkpoints and min(checkpoints) >= recorded["seq"]  # start-up folds from past the archived range
    assert cli("events", "--trace", "old-3", "--json").json_lines() == old_trace

    after = cli("log", "status", "--json").json()
    assert after["live"]["events"] == 14 - 10 + 1
    assert after["retention"]["archivable_now"] == 0 and after["archive"]["count"] == 1
    assert after["archive"]["segments"][0]["name"] == seg["name"]
    assert after["types"]["request.received"] == {"live": 1, "archived": 5}
    text = cli("log", "status").stdout
    assert "live log" in text and seg["name"] in text and "request_retention 30d" in text

    again = cli("log", "archive")
    assert "nothing to archive" in again.stdout
    assert len(cli("events", "--type", "log.archived", "--json").json_lines()) == 1
    db = cli("db", "status", "--json").json()
    assert (db["events"], db["seq_last"], db["archived_events"], db["archived_segments"]) == (5, 15, 10, 1)


def test_status_and_archive_on_a_postgresql_log(cli: Cli) -> None:
    from tests.support.postgres import cluster

    url = cluster().new_database()
    cli.env["BLAZAR_DATABASE_URL"] = url
    seed_history(cli.home, age_s=40 * DAY_S, traces=3, env={"BLAZAR_DATABASE_URL": url})
    before = cli("log", "status", "--json").json()
    assert before["backend"] == "postgresql" and before["live"]["bytes"] > 0
    assert before["retention"]["archivable_now"] == 6
    old_trace = cli("events", "--trace", "old-1", "--json").json_lines()
    done = cli("log", "archive", "--json").json()
    assert done["events"] == 6 and len(done["segments"]) == 1
    assert cli("events", "--trace", "old-1", "--json").json_lines() == old_trace
    after = cli("log", "status", "--json").json()
    assert after["archive"]["count"] == 1 and after["types"]["request.received"] == {"live": 0, "archived": 3}
    db = cli("db", "status", "--json").json()
    assert (db["events"], db["archived_events"], db["archived_segments"]) == (2, 6, 1)
    found = {c["check"]: c for c in cli("doctor", "--json", check=False).json()["checks"]}
    for name in ("log.seq", "log.segments", "log.archive_orphans", "log.disk_share"):
        assert found[name]["status"] == "ok", found[name]
    assert "PostgreSQL" in found["log.disk_share"]["observation"]


def test_retention_zero_archives_nothing_and_says_so(cli: Cli) -> None:
    seed_history(cli.home, age_s=400 * DAY_S, traces=2)
    cli("config", "set", "retention.request_retention", "0")
    res = cli("log", "archive")
    assert "nothing archived: request_retention is 0" in res.stdout
    assert cli("log", "archive", "--json").json()["skipped"].startswith("request_retention is 0")
    assert cli("events", "--type", "log.archived", "--json").json_lines() == []
    status = cli("log", "status", "--json").json()
    assert status["retention"]["cutoff"] is None and status["retention"]["archivable_now"] == 0
    assert "nothing is archived" in cli("log", "status").stdout
    # --older-than still archives on demand.
    assert cli("log", "archive", "--older-than", "1d", "--json").json()["events"] == 4


def test_a_bad_older_than_is_refused(cli: Cli) -> None:
    for bad in ("soon", "0", "-5m"):
        res = cli("log", "archive", "--older-than", bad, check=False)
        assert res.code == 2 and "--older-than" in res.stderr, (bad, res.stderr)


def test_another_run_under_way_refuses_cleanly(cli: Cli) -> None:
    seed_history(cli.home, age_s=40 * DAY_S, traces=2)
    root = cli.home / "archive"
    root.mkdir(mode=0o700, exist_ok=True)
    with (root / ".archive.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        res = cli("log", "archive", check=False)
    assert res.code == 5 and "another archive run is under way" in res.stderr and "Traceback" not in res.stderr
    assert cli("events", "--type", "log.archived", "--json").json_lines() == []
    assert cli("events", "--type", "log.archive_failed", "--json").json_lines() == []  # busy is not a failure
    assert cli("log", "archive", "--json").json()["events"] == 4  # and it runs once the other is done


def test_a_failed_run_is_recorded_and_exits_non_zero(cli: Cli, tmp_path: Path) -> None:
    seed_history(cli.home, age_s=40 * DAY_S, traces=2)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the archive directory should be")
    cli.env["BLAZAR_ARCHIVE_DIR"] = str(blocker)
    res = cli("log", "archive", check=False)
    assert res.code == 5 and "archiving failed" in res.stderr and "Traceback" not in res.stderr
    (failed,) = cli("events", "--type", "log.archive_failed", "--json").json_lines()
    assert failed["data"]["segments"] == 0 and failed["data"]["reason"]
    assert abs(failed["data"]["cutoff"] - (time.time() - 30 * DAY_S)) < 120
    assert len(cli("events", "--trace", "old-1", "--json").json_lines()) == 2  # nothing left the live log


def test_doctor_names_a_segment_start_up_cannot_read(cli: Cli) -> None:
    seed_history(cli.home, age_s=40 * DAY_S, traces=2)
    (seg,) = cli("log", "archive", "--json").json()["segments"]
    healthy = {c["check"]: c for c in cli("doctor", "--json", check=False).json()["checks"]}
    assert healthy["log.segments"]["status"] == "ok" and healthy["log.seq"]["status"] == "ok"
    (cli.home / "archive" / f"{seg['name']}.jsonl.gz").unlink()
    with sqlite3.connect(home_paths(cli.home).db) as conn:
        conn.execute("DELETE FROM checkpoints")  # derived data: now start-up must fold through the segment
    res = cli("doctor", "--json", check=False)
    found = {c["check"]: c for c in res.json()["checks"]}
    assert res.code == 2 and found["log.segments"]["status"] == "fail"
    assert seg["name"] in found["log.segments"]["observation"] and "missing" in found["log.segments"]["observation"]
