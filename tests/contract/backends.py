"""The log backends the contract suite runs against: how to make a fresh one and how to open an `EventLog` on it.

A backend is named by a string (the fixture's param) and located by another (`location`: a file path for SQLite,
a URL for a server, parsed by `parse_location` as the CLI's edge parses it), so a child process given both can open
the same log. Adding a backend is one entry in `BACKENDS` (and a store `blazar.logdb.open_log` knows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from blazar import config
from blazar.clock import Clock
from blazar.events.location import parse_location
from blazar.events.log import EventLog
from blazar.logdb import open_log as open_location
from blazar.paths import Paths


@dataclass(frozen=True)
class Backend:
    """One fresh, empty log and the Blazar home around it."""

    name: str
    location: str  # what `open_log(location)` needs, in this process or a child
    paths: Paths  # the home: what `bootstrap()`, snapshots and the CLI work from

    @property
    def env(self) -> dict[str, str]:
        """The environment a `blazar` command needs to find this home (and its log)."""
        return {"BLAZAR_HOME": str(self.paths.data_dir)}

    async def open(self, *, clock: Clock | None = None) -> EventLog:
        return await open_log(self.location, clock=clock, archive=self.paths.archive)


def _make_postgresql(root: Path) -> Backend:
    """A fresh database in the session's throwaway cluster, named in the home's config.toml (database_url), as a
    user sets it: bootstrap, snapshots and the CLI find the log there."""
    from tests.support.postgres import cluster

    url = cluster().new_database()
    paths = Paths.from_env({"BLAZAR_HOME": str(root)})
    paths.ensure()
    config.write_file(paths.config_file, {"log.database_url": url})
    return Backend(name="postgresql", location=url, paths=paths)


def _make_sqlite(root: Path) -> Backend:
    paths = Paths.from_env({"BLAZAR_HOME": str(root)})
    paths.ensure()
    return Backend(name="sqlite", location=str(paths.db), paths=paths)


BACKENDS: dict[str, Callable[[Path], Backend]] = {"sqlite": _make_sqlite, "postgresql": _make_postgresql}


async def open_log(location: str, *, clock: Clock | None = None, archive: Path | None = None) -> EventLog:
    """The log at `location`: a URL names a database, a file path a SQLite log (what a restore keeps aside too)."""
    return await open_location(parse_location(location), clock=clock, archive=archive)
