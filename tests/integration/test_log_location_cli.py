"""A log location that cannot be read stops the real CLI with a clear message and exit code 2, whatever the command
and wherever it was set (BLAZAR_DATABASE_URL, config.toml, `db migrate-to`'s argument); nothing is made in its
place: no SQLite file named after the URL, in the working directory or the home. `doctor` reports it as the log's
failing check."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Cli

BAD_PORT = "postgresql+asyncpg://blazar@127.0.0.1:145405/nowhere"
UNKNOWN_SCHEME = "postgres+foo://blazar@127.0.0.1:5432/nowhere"


def _made(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("*") if "postgres" in p.name or "nowhere" in p.name]


@pytest.mark.parametrize("command", [("events",), ("db", "status"), ("db", "upgrade"), ("state",)])
def test_a_bad_database_url_stops_every_command_with_exit_code_2(cli: Cli, command: tuple[str, ...]) -> None:
    cli.env["BLAZAR_DATABASE_URL"] = BAD_PORT
    res = cli(*command, check=False)
    said = " ".join(res.stderr.split())
    assert res.code == 2, res.stderr
    assert "BLAZAR_DATABASE_URL" in said and "port '145405'" in said and "Traceback" not in res.stderr
    assert _made(Path.cwd(), cli.home) == []


def test_an_unknown_scheme_in_config_toml_is_named_with_the_file(cli: Cli) -> None:
    cli.home.mkdir(exist_ok=True)
    (cli.home / "config.toml").write_text(f'[log]\ndatabase_url = "{UNKNOWN_SCHEME}"\n')  # a hand edit
    res = cli("events", check=False)
    said = " ".join(res.stderr.split())
    assert res.code == 2 and "config.toml" in said and "unknown database URL scheme 'postgres+foo://'" in said
    assert _made(Path.cwd(), cli.home) == []


def test_migrate_to_refuses_a_url_it_cannot_read_before_opening_anything(cli: Cli) -> None:
    res = cli("db", "migrate-to", BAD_PORT, check=False)
    assert res.code == 2 and "port '145405'" in " ".join(res.stderr.split())
    assert not (cli.home / "blazar.db").exists()  # the home's own log was not even opened
    assert _made(Path.cwd(), cli.home) == []


def test_doctor_reports_a_bad_database_url_as_the_logs_failing_check(cli: Cli) -> None:
    cli.env["BLAZAR_DATABASE_URL"] = BAD_PORT
    found = {c["check"]: c for c in cli("doctor", "--json", check=False).json()["checks"]}
    assert found["log.database"]["status"] == "fail" and "port '145405'" in found["log.database"]["observation"]
    assert _made(Path.cwd(), cli.home) == []
