"""The log backends the contract suite runs against: how to make a fresh one and how to open an `EventLog` on it.

A backend is named by a string (the fixture's param) and located by another (`location`: a file path for SQLite,
a URL for a server), so a child process given both can open the same log. Adding a backend is one entry in
`BACKENDS` and one in `OPENERS`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from blazar.clock import Clock
from blazar.events.log import EventLog
from blazar.paths import Paths


@dataclass(frozen=True)
class Backend:
    """One fresh, empty log and the Blazar home around it."""

    name: str
    location: str  # what `open_log(name, location)` needs, in this process or a child
    paths: Paths  # the home: what `bootstrap()`, snapshots and the CLI work from

    @property
    def env(self) -> dict[str, str]:
        """The environment a `blazar` command needs to find this home (and its log)."""
        return {"BLAZAR_HOME": str(self.paths.data_dir)}

    async def open(self, *, clock: Clock | None = None) -> EventLog:
        return await open_log(self.name, self.location, clock=clock)


async def _open_sqlite(location: str, clock: Clock | None) -> EventLog:
    return await EventLog.open(Path(location), clock=clock)


def _make_sqlite(root: Path) -> Backend:
    paths = Paths.from_env({"BLAZAR_HOME": str(root)})
    paths.ensure()
    return Backend(name="sqlite", location=str(paths.db), paths=paths)


OPENERS: dict[str, Callable[[str, Clock | None], Awaitable[EventLog]]] = {"sqlite": _open_sqlite}
BACKENDS: dict[str, Callable[[Path], Backend]] = {"sqlite": _make_sqlite}


async def open_log(name: str, location: str, *, clock: Clock | None = None) -> EventLog:
    return await OPENERS[name](location, clock)
