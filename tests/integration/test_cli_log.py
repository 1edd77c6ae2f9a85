"""The CLI over the log, end to end through the real `blazar` command: events, state, db, config."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.conftest import Cli


def _changes(cli: Cli) -> None:
    cli("config", "set", "telemetry.log_level", "debug")
    cli("config", "set", "log.checkpoint_every", "500")
    cli("config", "set", "telemetry.log_level", "error")


def test_events_lists_and_filters(cli: Cli) -> None:
    _changes(cli)
    rows = cli("events", "--json").json_lines()
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert rows[0]["type"] == "config.changed" and rows[0]["data"]["new"] == "debug"
    assert [r["seq"] for r in cli("events", "--json", "--stream", "config:telemetry.log_level").json_lines()] == [1, 3]
    assert [r["seq"] for r in cli("events", "--json", "--after", "1", "-n", "1").json_lines()] == [2]
    assert cli("events", "--json", "--type", "snapshot.taken").json_lines() == []
    assert cli("events", "--json", "--since", "1h").json_lines() == rows
    assert cli("events", "--json", "--until", "2000-01-01").json_lines() == []
    table = cli("events").stdout
    assert "config.changed" in table and "config:telemetry.log_level" in table


def test_events_rejects_a_bad_time(cli: Cli) -> None:
    res = cli("events", "--since", "yesterday-ish", check=False)
    assert res.code == 2 and "not a time" in res.stderr


def test_events_follow_prints_new_events(cli: Cli) -> None:
    cli("config", "set", "telemetry.log_level", "debug")
    proc = subprocess.Popen(
        [sys.executable, "-m", "blazar.cli.main", "events", "--follow", "--json"],
        env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert '"seq":1' in first
        cli("config", "set", "telemetry.log_level", "info")
        deadline = time.monotonic() + 15
        second = proc.stdout.readline()
        assert time.monotonic() < deadline and '"seq":2' in second and '"new":"info"' in second
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_state_now_and_at_a_past_seq_or_time(cli: Cli) -> None:
    _changes(cli)
    now = cli("state", "--json").json()
    assert now["seq"] == 3
    assert now["projections"]["config"]["overrides"] == {"telemetry.log_level": "error", "log.checkpoint_every": 500}
    assert now["projections"]["stats"]["by_type"] == {"config.changed": 3}
    at1 = cli("state", "--json", "--at", "1").json()
    assert at1["seq"] == 1 and at1["projections"]["config"]["overrides"] == {"telemetry.log_level": "debug"}
    events = cli("events", "--json").json_lines()
    at_time = cli("state", "--json", "--at", str(events[1]["ts"])).json()
    assert at_time["seq"] == 2
    assert cli("state", "--json", "--at", "2000-01-01T00:00:00Z").json()["seq"] == 0
    assert "state as of seq 3" in cli("state").stdout


def test_db_status_and_upgrade(cli: Cli) -> None:
    cli("db", "upgrade")
    st = cli("db", "status", "--json").json()
    assert st["current"] == st["head"] and st["pending"] == [] and st["journal_mode"] == "wal"
    assert "already at" in cli("db", "upgrade").stdout


def test_config_commands_end_to_end(cli: Cli) -> None:
    defaults = cli("config", "defaults", "--json").json()
    assert defaults["telemetry.log_level"] == "warning"
    toml = cli("config", "defaults").stdout
    assert "[log]\n" in toml and "checkpoint_every = 10000" in toml
    assert "seq 1" in cli("config", "set", "telemetry.pii_scrub", "false").stdout
    assert cli("config", "get", "telemetry.pii_scrub").stdout.strip() == "false"
    listing = {r["key"]: r for r in cli("config", "list", "--json").json()}
    assert listing["telemetry.pii_scrub"]["source"] == "config.toml"
    assert listing["telemetry.log_level"]["source"] == "default"
    bad = cli("config", "set", "telemetry.log_level", "loud", check=False)
    assert bad.code == 2 and "expected one of: debug, info, warning, error" in bad.stderr
    unknown = cli("config", "get", "colour", check=False)
    assert unknown.code == 2 and "valid keys:" in unknown.stderr
    cli("config", "unset", "telemetry.pii_scrub")
    assert cli("config", "get", "telemetry.pii_scrub", "--json").json() == {"key": "telemetry.pii_scrub", "value": True}
    assert [e["data"]["new"] for e in cli("events", "--json").json_lines()] == [False, None]


def test_hand_edit_is_noticed_at_next_start(cli: Cli) -> None:
    cli("config", "set", "telemetry.log_level", "debug")
    (cli.home / "config.toml").write_text('[telemetry]\nlog_level = "info"\n')
    events = cli("events", "--json").json_lines()
    assert events[-1]["data"] == {"key": "telemetry.log_level", "old": "debug", "new": "info", "source": "file"}


def test_old_flat_keys_are_still_taken_each_time_saying_their_new_name(cli: Cli) -> None:
    """Keys had no sections before: an old name still works in config.toml and on the command line, and each use
    says the key's new name; `config set` writes the new one."""
    (cli.home / "config.toml").write_text("queue_depth = 7\n")
    got = cli("config", "get", "queue_depth")
    assert got.stdout.strip() == "7"
    assert "the config key 'queue_depth' is deprecated: it is now 'queue.queue_depth'" in got.stderr
    assert "config.toml: the config key 'queue_depth' is deprecated" in got.stderr  # the file's old name too
    res = cli("config", "set", "ctx", "2048")
    assert "fit.ctx = 2048" in res.stdout and "config set: the config key 'ctx' is deprecated" in res.stderr
    assert (cli.home / "config.toml").read_text().endswith("[fit]\nctx = 2048\n\n[queue]\nqueue_depth = 7\n")
    assert "deprecated" not in cli("config", "get", "queue.queue_depth").stderr  # the file is sectioned now
    assert [e["data"]["key"] for e in cli("events", "--json").json_lines()] == ["queue.queue_depth", "fit.ctx"]


def test_a_broken_config_file_is_reported_and_can_be_repaired(cli: Cli) -> None:
    (cli.home / "config.toml").write_text("colour = 'red'\n")
    res = cli("state", check=False)
    assert res.code == 2 and "unknown config key 'colour'" in res.stderr
    cli("config", "unset", "colour")
    assert cli("state", "--json").json()["seq"] == 0


COMMANDS = [
    [], ["events"], ["state"], ["db"], ["db", "status"], ["db", "upgrade"], ["config"], ["config", "defaults"],
    ["config", "list"], ["config", "get"], ["config", "set"], ["config", "unset"], ["log"], ["log", "status"],
    ["log", "archive"],
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "blazar")
def test_every_command_has_help(cli: Cli, cmd: list[str]) -> None:
    res = cli(*cmd, "--help")
    assert "Usage:" in res.stdout and len(res.stdout) > 100
