"""Where the log lives: the embedded SQLite file (the default), or a PostgreSQL database named by a URL
(`BLAZAR_DATABASE_URL`, else `database_url` in config.toml, read before the log is opened: the log cannot hold the
setting that says where the log is). PostgreSQL's code, and asyncpg, are imported only when a URL asks for them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from blazar import config
from blazar.clock import Clock
from blazar.errors import ConfigError
from blazar.events.log import EventLog
from blazar.paths import Paths

URL_PREFIXES = ("postgresql://", "postgresql+asyncpg://", "postgres://")


def is_url(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith(URL_PREFIXES)


def log_location(paths: Paths, env: Mapping[str, str]) -> str | Path:
    """The log's URL when one is configured, else its SQLite file."""
    url = local_value(paths, env, "database_url", "BLAZAR_DATABASE_URL")
    return url if url else paths.db


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


async def open_log(location: str | Path, *, clock: Clock | None = None, migrate: bool = True) -> EventLog:
    """Open the log at `location` (a PostgreSQL URL or a SQLite file)."""
    if is_url(location):
        from blazar.events.log_pg import PgEventLog

        return await PgEventLog.open(str(location), clock=clock, migrate=migrate)
    return await EventLog.open(Path(location), clock=clock, migrate=migrate)
