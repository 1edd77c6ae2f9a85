"""The log on PostgreSQL end to end, through the real CLI and the real daemon: `blazar db migrate-to` copies a
SQLite home's log into an empty database and verifies it; with database_url set, every command reads and writes
that database; the daemon serves a chat (the fake engine) and `why` tells it from PostgreSQL; a second log never
rewrites the first."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx2
import openai
import pytest

from blazar.adapters.engines.tiny_model import write_tiny_model
from blazar.cli.daemon_client import auth_headers
from tests.conftest import Cli
from tests.support.blazar_home import home_paths
from tests.support.daemon import free_port, stop_home_daemon
from tests.support.fake_serving import fake_engine
from tests.support.postgres import Cluster, cluster


@pytest.fixture
def pg_url() -> str:
    return cluster().new_database()


def _seed(cli: Cli, tmp_path: Path) -> None:
    binary = fake_engine.write_executable(tmp_path / "fake" / "llama-server")
    cli("engine", "install", "--path", str(binary), timeout=120)
    cli("import", str(write_tiny_model(tmp_path / "tiny.gguf")), "--name", "tiny")
    cli("config", "set", "telemetry.log_level", "info")


def test_migrate_to_copies_a_sqlite_log_verifies_it_and_the_home_then_runs_on_postgresql(
        cli: Cli, tmp_path: Path, pg_url: str) -> None:
    _seed(cli, tmp_path)
    before = cli("events", "--json").json_lines()
    done = cli("db", "migrate-to", pg_url, "--json").json()
    assert done["events"] == len(before) and len(done["rows_sha256"]) == 64 and done["audit_records"] > 0
    again = cli("db", "migrate-to", pg_url, check=False)
    assert again.code != 0 and "already holds a log" in " ".join(again.stderr.split())

    cli("config", "set", "log.database_url", pg_url)
    status = cli("db", "status", "--json").json()
    assert (status["backend"], status["up_to_date"]) == ("postgresql", True)
    # The database holds the SQLite log's events, then the commands' own: the config change came after the copy.
    assert status["events"] == len(before)
    assert [e["seq"] for e in cli("events", "--json").json_lines()] == [e["seq"] for e in before]
    cli("config", "set", "telemetry.log_level", "debug")
    after = cli("events", "--type", "config.changed", "--json").json_lines()
    assert after[-1]["data"]["new"] == "debug" and after[-1]["seq"] == len(before) + 1
    # A password in the URL is refused: config.toml's changes are recorded in the log.
    bad = cli("config", "set", "log.database_url", "postgresql://u:secret@db/x", check=False)
    assert bad.code == 2 and "PGPASSWORD" in " ".join(bad.stderr.split())


def test_the_daemon_serves_from_a_postgresql_log_and_why_reads_it_back(cli: Cli, tmp_path: Path,
                                                                       pg_url: str) -> None:
    cli.env["BLAZAR_DATABASE_URL"] = pg_url
    _seed(cli, tmp_path)
    port = free_port()
    cli("config", "set", "server.port", str(port))
    try:
        cli("load", "tiny", timeout=120)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        trace = raw.headers["x-blazar-trace-id"]
        why = None
        for _ in range(100):
            res = cli("why", trace, "--json", check=False)
            if res.code == 0 and res.json()["outcome"] == "completed":
                why = res.json()
                break
        assert why is not None and why["verdict"].startswith("completed 200")
    finally:
        stop_home_daemon(cli.home)
    # Nothing of it went to a SQLite file: the home has none.
    assert not (cli.home / "blazar.db").exists()
    rows = subprocess.run([str(cluster().bin / "psql"), pg_url.replace("+asyncpg", ""), "-tAc",
                           "SELECT count(*) FROM events WHERE type = 'request.completed'"],
                          capture_output=True, text=True, timeout=30, check=True)
    assert int(rows.stdout.strip()) == 1


def test_doctor_checks_a_postgresql_log(cli: Cli, tmp_path: Path, pg_url: str) -> None:
    cli.env["BLAZAR_DATABASE_URL"] = pg_url
    _seed(cli, tmp_path)
    found = {c["check"]: c for c in cli("doctor", "--json", check=False).json()["checks"]}
    assert found["log.database"]["status"] == "ok" and "PostgreSQL" in found["log.database"]["observation"]
    for name in ("schema", "seq", "triggers", "clock"):
        assert found[f"log.{name}"]["status"] == "ok", found[f"log.{name}"]
    cli.env["BLAZAR_DATABASE_URL"] = f"postgresql+asyncpg://blazar@127.0.0.1:{free_port()}/nowhere"  # nobody there
    down = {c["check"]: c for c in cli("doctor", "--json", check=False).json()["checks"]}
    assert down["log.database"]["status"] == "fail" and "cannot reach" in down["log.database"]["observation"]


def test_with_postgresql_down_loaded_models_still_answer_control_changes_wait_and_the_events_land_later(
        cli: Cli, tmp_path: Path) -> None:
    """A cluster of this test's own, stopped under a running daemon: a chat to a loaded model is served (its
    request events wait in memory), a load is refused with 503 log_unavailable, and once PostgreSQL is back the
    buffered events are committed: `why` tells the chat from the log."""
    own = Cluster(cluster().bin)
    own.start()
    try:
        url = own.new_database()
        cli.env["BLAZAR_DATABASE_URL"] = url
        _seed(cli, tmp_path)
        cli("import", str(write_tiny_model(tmp_path / "tiny2.gguf")), "--name", "other")
        port = free_port()
        cli("config", "set", "server.port", str(port))
        cli("load", "tiny", timeout=120)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)

        own.halt()
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert raw.status_code == 200 and raw.parse().choices[0].message.content
        trace = raw.headers["x-blazar-trace-id"]
        refused = httpx2.post(f"http://127.0.0.1:{port}/api/blazar/load", json={"model": "other"}, timeout=60,
                              headers=auth_headers(home_paths(cli.home)))
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "log_unavailable"

        own.resume()
        why = None
        for _ in range(200):
            res = cli("why", trace, "--json", check=False)
            if res.code == 0 and res.json()["outcome"] == "completed":
                why = res.json()
                break
            time.sleep(0.1)
        assert why is not None, "the buffered request events never reached the log"
    finally:
        stop_home_daemon(cli.home)
        own.stop()
