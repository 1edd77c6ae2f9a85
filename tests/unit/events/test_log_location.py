"""Where the log lives is parsed once, at the edge, into a `SqliteFile` or a `PostgresUrl`: a file path is a SQLite
log, a PostgreSQL URL a database, and text that reads as a URL but is not a valid PostgreSQL one is an
InvalidLogLocation (exit code 2), never a file path."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar import config
from blazar.errors import ConfigError, InvalidLogLocation, exit_code_of
from blazar.events.location import PostgresUrl, SqliteFile, parse_location
from blazar.logdb import log_location
from blazar.paths import Paths

GOOD_URLS = [
    "postgresql+asyncpg://blazar@127.0.0.1:5432/blazar",
    "postgresql://blazar@db.lan/blazar",
    "postgres://u:secret@db.lan:6543/x",
    "postgresql://blazar@[::1]:5432/blazar",
    "postgresql://blazar@h1:5432,h2:5433/blazar",
    "postgresql:///blazar?host=/var/run/postgresql",
    "POSTGRESQL://blazar@db.lan/blazar",
]
BAD_URLS = [
    ("postgresql+asyncpg://blazar@127.0.0.1:145405/nowhere", "port '145405'"),
    ("postgresql://blazar@127.0.0.1:0/x", "port '0'"),
    ("postgresql://blazar@127.0.0.1:54x2/x", "port '54x2'"),
    ("postgresql://blazar@h1:5432,h2:99999/x", "port '99999'"),
    ("postgres+foo://blazar@127.0.0.1:5432/x", "unknown database URL scheme 'postgres+foo://'"),
    ("mysql://root@127.0.0.1/x", "unknown database URL scheme 'mysql://'"),
    ("sqlite:///home/me/blazar.db", "unknown database URL scheme 'sqlite://'"),
    ("postgresql://blazar@[::1/x", "cannot read the host"),
    ("postgresql+asyncpg:/blazar@127.0.0.1/x", "not a PostgreSQL URL"),
]


@pytest.mark.parametrize("text", ["blazar.db", "/var/lib/blazar/blazar.db", "./logs/a:b.db", "dir/with space.db"])
def test_a_path_is_a_sqlite_file(text: str) -> None:
    assert parse_location(text) == SqliteFile(Path(text))
    assert parse_location(Path(text)) == SqliteFile(Path(text))
    assert not SqliteFile(Path(text)).shared


@pytest.mark.parametrize("text", GOOD_URLS)
def test_a_postgresql_url_is_a_database(text: str) -> None:
    url = parse_location(text)
    assert url == PostgresUrl(text) and url.shared
    assert isinstance(url, PostgresUrl)
    rest = text.partition("://")[2]
    assert (url.sqlalchemy, url.driver) == ("postgresql+asyncpg://" + rest, "postgresql://" + rest)


def test_the_password_never_shows() -> None:
    url = PostgresUrl.parse("postgresql://blazar:s3cret@db.lan:5432/blazar")
    assert "s3cret" not in str(url) and "s3cret" not in repr(url) and "s3cret" not in f"{url}"
    assert str(url) == "postgresql://blazar:***@db.lan:5432/blazar"
    assert "s3cret" in url.driver  # what connects keeps it


@pytest.mark.parametrize(("text", "says"), BAD_URLS, ids=[t for t, _ in BAD_URLS])
def test_a_url_that_cannot_be_read_is_an_error_never_a_path(text: str, says: str) -> None:
    with pytest.raises(InvalidLogLocation) as caught:
        parse_location(text)
    assert says in caught.value.message
    with pytest.raises(InvalidLogLocation):
        PostgresUrl.parse(text)


def test_an_error_hides_the_password_and_is_an_input_error() -> None:
    with pytest.raises(InvalidLogLocation) as caught:
        PostgresUrl.parse("postgresql://blazar:s3cret@db.lan:70000/x")
    assert "s3cret" not in caught.value.message and "70000" in caught.value.message
    assert caught.value.exit_code == 2 and exit_code_of("invalid_log_location") == 2
    assert caught.value.http_status == 400


def test_a_plain_path_is_never_taken_for_a_url() -> None:
    with pytest.raises(InvalidLogLocation):
        parse_location("   ")
    with pytest.raises(InvalidLogLocation, match="not a PostgreSQL URL"):
        PostgresUrl.parse("/var/lib/blazar/blazar.db")


def _paths(tmp_path: Path) -> Paths:
    paths = Paths.from_env({"BLAZAR_HOME": str(tmp_path)})
    paths.ensure()
    return paths


def test_the_configured_location_is_the_home_file_or_the_url(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    assert log_location(paths, {}) == SqliteFile(paths.db)
    url = "postgresql+asyncpg://blazar@127.0.0.1:5432/blazar"
    assert log_location(paths, {"BLAZAR_DATABASE_URL": url}) == PostgresUrl(url)
    config.write_file(paths.config_file, {"database_url": url})
    assert log_location(paths, {}) == PostgresUrl(url)


def test_a_bad_configured_url_is_an_error_that_says_where_it_was_set(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    bad = "postgresql+asyncpg://blazar@127.0.0.1:145405/nowhere"
    with pytest.raises(InvalidLogLocation, match=r"^BLAZAR_DATABASE_URL: .*port '145405'"):
        log_location(paths, {"BLAZAR_DATABASE_URL": bad})
    paths.config_file.write_text(f'[log]\ndatabase_url = "{bad}"\n')  # a hand edit: `config set` would refuse it
    with pytest.raises(InvalidLogLocation, match=r"database_url in .*config\.toml: .*port '145405'"):
        log_location(paths, {})


def test_config_refuses_a_database_url_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="port '145405'"):
        config.validate_value("log.database_url", "postgresql+asyncpg://blazar@127.0.0.1:145405/nowhere")
    with pytest.raises(ConfigError, match="unknown database URL scheme"):
        config.validate_value("log.database_url", "postgres+foo://blazar@127.0.0.1/x")
