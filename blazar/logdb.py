"""Where the log lives, read once at the edge: the embedded SQLite file (the default), or a PostgreSQL database named
by a URL (`BLAZAR_DATABASE_URL`, else `database_url` in config.toml, read before the log is opened: the log cannot
hold the setting that says where the log is). The answer is typed (`SqliteFile` or `PostgresUrl`, from
blazar/events/location.py); a URL that cannot be read is an InvalidLogLocation, never a file. PostgreSQL's code, and
asyncpg, are imported only when a URL asks for them."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

from blazar import config
from blazar.clock import Clock
from blazar.errors import ConfigError, InvalidLogLocation
from blazar.events.location import LogLocation, PostgresUrl, SqliteFile
from blazar.events.log import EventLog
from blazar.events.log_sqlite import SqliteEventLog
from blazar.events.segment_store import SegmentStore
from blazar.paths import Paths


def log_location(paths: Paths, env: Mapping[str, str]) -> LogLocation:
    """The log's URL when one is configured, else its SQLite file. Raises InvalidLogLocation for a URL that cannot
    be read (naming where it was set)."""
    from_env = env.get("BLAZAR_DATABASE_URL", "").strip()
    url = local_value(paths, env, "log.database_url", "BLAZAR_DATABASE_URL")
    if not url:
        return SqliteFile(paths.db)
    try:
        return PostgresUrl.parse(url)
    except InvalidLogLocation as e:
        where = "BLAZAR_DATABASE_URL" if from_env else f"log.database_url in {paths.config_file}"
        raise InvalidLogLocation(f"{where}: {e.message}") from None


def local_value(paths: Paths, env: Mapping[str, str], key: str, variable: str) -> str:
    """A local key (config.LOCAL_KEYS): its environment variable, else this home's config.toml, never the log's
    config (read before the log opens, or about this machine alone). "" when neither says."""
    value = env.get(variable, "").strip()
    if value:
        return value
    try:
        return str(config.read_file_raw(paths.config_file).get(key) or "").strip()
    except ConfigError:
        return ""  # a broken config.toml is reported where it is read in full (reconcile_file)


def archive_location(paths: Paths, env: Mapping[str, str]) -> Path:
    """Where this home's archive segments are: `archive_dir` (BLAZAR_ARCHIVE_DIR, else config.toml), else the home's
    archive/ directory. A local key: the log never says where files go."""
    given = local_value(paths, env, "retention.archive_dir", "BLAZAR_ARCHIVE_DIR")
    if not given:
        return paths.archive
    path = Path(given).expanduser()
    if not path.is_absolute():
        raise ConfigError(f"archive_dir must be an absolute path, not {given!r}")
    return path


async def open_log(location: LogLocation, *, clock: Clock | None = None, migrate: bool = True,
                   archive: Path | None = None) -> EventLog:
    """Open the log at `location`, with the store it names; `archive` is where its segments are read from (a
    SQLite log defaults to archive/ beside its file)."""
    match location:
        case SqliteFile(path):
            return await SqliteEventLog.open(path, clock=clock, migrate=migrate, archive=archive)
        case PostgresUrl():
            from blazar.events.log_pg import PgEventLog

            log = await PgEventLog.open(location, clock=clock, migrate=migrate)
            if archive is not None:
                log.archive = SegmentStore(archive)
            return log


async def live_bytes(log: EventLog) -> int:
    """What the live log takes: its SQLite file and WAL, or `pg_total_relation_size` of the events table (its rows,
    indexes and TOAST) on PostgreSQL."""
    match log.location:
        case SqliteFile(path):
            total = 0
            for p in (path, path.with_name(path.name + "-wal")):
                with contextlib.suppress(FileNotFoundError):
                    total += p.stat().st_size
            return total
        case PostgresUrl():
            return int((await log._fetch("SELECT pg_total_relation_size('events')"))[0][0])
