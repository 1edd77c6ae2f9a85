"""Where a log lives, as a type: a `SqliteFile` (the embedded log, a path) or a `PostgresUrl` (a database several
gateways may share). Text becomes one of them once, at the edge (config.toml, BLAZAR_DATABASE_URL, a command's
argument), through `parse_location` or `PostgresUrl.parse`; past that edge nothing asks whether a string is a URL.

NOTE: text with `://` in it is a URL or an error (`InvalidLogLocation`), never a file path: a mistyped URL once
became a SQLite log named `postgresql+asyncpg:1/blazar@127.0.0.1:145405/nowhere` in the working directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from blazar.errors import InvalidLogLocation

SCHEMES = ("postgresql+asyncpg", "postgresql", "postgres")
EXAMPLE = "postgresql+asyncpg://blazar@db.lan:5432/blazar"
# One host of a libpq URL's host list: a name, an IPv4 address or a bracketed IPv6 one, then an optional port.
# Text that opens like a URL (`scheme:/`): parsed as one, so a mistyped URL is an error rather than a file name.
_URL_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")
_HOST = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\[\]:/,@]*)(?::(?P<port>[^:/,@]*))?")


@dataclass(frozen=True, slots=True)
class SqliteFile:
    """The embedded log: one SQLite file (its WAL and lock beside it)."""

    path: Path

    # Whether several gateways may share this log (then each home is a node among them).
    shared: ClassVar[bool] = False

    def __str__(self) -> str:
        return str(self.path)


@dataclass(frozen=True, slots=True)
class PostgresUrl:
    """A log in PostgreSQL, by URL (`postgresql+asyncpg://`, `postgresql://` or `postgres://`). `url` is the text as
    given, password and all; `str()` and `repr()` show it without the password."""

    url: str

    shared: ClassVar[bool] = True

    @classmethod
    def parse(cls, text: str) -> PostgresUrl:
        """The URL, checked: a known scheme, and host:port pairs a connection could use. Raises InvalidLogLocation."""
        url = text.strip()
        scheme, sep, rest = url.partition("://")
        if not sep:
            raise InvalidLogLocation(f"not a PostgreSQL URL: {redact(url)!r} (expected one like {EXAMPLE})")
        if scheme.lower() not in SCHEMES:
            raise InvalidLogLocation(f"unknown database URL scheme {scheme + '://'!r} in {redact(url)!r}: Blazar's log "
                                     f"takes {', '.join(s + '://' for s in SCHEMES)} (for example {EXAMPLE})")
        netloc = rest.split("/", 1)[0].split("?", 1)[0]
        hosts = netloc.rpartition("@")[2]
        for one in hosts.split(","):
            _check_host(one, url)
        try:
            urlsplit(url)
        except ValueError as e:
            raise InvalidLogLocation(f"not a valid PostgreSQL URL: {redact(url)!r} ({e})") from None
        return cls(url)

    @property
    def sqlalchemy(self) -> str:
        """The URL as SQLAlchemy's asyncpg dialect takes it."""
        return "postgresql+asyncpg://" + self.url.partition("://")[2]

    @property
    def driver(self) -> str:
        """The URL as asyncpg takes it."""
        return "postgresql://" + self.url.partition("://")[2]

    @property
    def redacted(self) -> str:
        return redact(self.url)

    def __str__(self) -> str:
        return self.redacted

    def __repr__(self) -> str:
        return f"PostgresUrl({self.redacted!r})"


LogLocation = SqliteFile | PostgresUrl


def parse_location(text: str | Path) -> LogLocation:
    """A log's location from a path or a URL: text with `://` must be a PostgreSQL URL (else InvalidLogLocation);
    anything else is a SQLite file."""
    if isinstance(text, Path):
        return SqliteFile(text)
    if "://" in text or _URL_LIKE.match(text.strip()):
        return PostgresUrl.parse(text)
    if not text.strip():
        raise InvalidLogLocation("no log location given (a SQLite file's path or a PostgreSQL URL)")
    return SqliteFile(Path(text))


def redact(url: str) -> str:
    """The URL without its password, for messages and the log."""
    head, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{head}{sep}{user}:***@{host}" if ":" in creds else url


def _check_host(one: str, url: str) -> None:
    found = _HOST.fullmatch(one)
    if found is None:
        raise InvalidLogLocation(f"not a valid PostgreSQL URL: {redact(url)!r} (cannot read the host {one!r})")
    port = found["port"]
    if port is None or port == "":
        return
    if not port.isdigit() or not 0 < int(port) <= 65535:
        raise InvalidLogLocation(f"not a valid PostgreSQL URL: {redact(url)!r} (port {port!r} is not a number "
                                 "from 1 to 65535)")
