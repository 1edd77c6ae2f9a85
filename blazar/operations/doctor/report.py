"""What a doctor check says: ok, warn or fail, what it saw, the command that fixes it, and the safe actions
`blazar doctor --fix` may take about it; and the exit code of a whole report."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["ok", "warn", "fail"]
Area = Literal["engine", "store", "log", "machine"]
EXIT_CODES: dict[Status, int] = {"ok": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class Action:
    """A repair a check proved safe. `remove_file`: `path` is a stale run file. `stop_process`: `pid` runs `path`,
    an engine of this home, and nothing of ours owns it. `remove_bank_file`: `path` is a KV-bank save no event
    records."""

    kind: Literal["remove_file", "stop_process", "remove_bank_file"]
    path: str
    pid: int | None = None
    why: str = ""  # the observation that made it safe, recorded with the fix


@dataclass(frozen=True)
class Check:
    area: Area
    name: str
    status: Status
    observation: str
    fix: str | None = None  # the command (or step) that fixes it; None when there is nothing to do
    actions: tuple[Action, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.area}.{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {"check": self.id, "area": self.area, "name": self.name, "status": self.status,
                "observation": self.observation, "fix": self.fix, "fixable": bool(self.actions)}


def ok(area: Area, name: str, observation: str) -> Check:
    return Check(area, name, "ok", observation)


def overall(checks: Iterable[Check]) -> Status:
    worst: Status = "ok"
    for c in checks:
        if EXIT_CODES[c.status] > EXIT_CODES[worst]:
            worst = c.status
    return worst


def exit_code(checks: Iterable[Check]) -> int:
    """0 when every check is ok, 1 when one warns, 2 when one fails."""
    return EXIT_CODES[overall(checks)]
