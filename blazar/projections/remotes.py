"""The `remotes` projection: every registered remote engine (its URL, models, the name of its key's environment
variable, its concurrency) and its circuit, and which model each remote serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blazar.events.base import Recorded
from blazar.events.remotes import RemoteAdded, RemoteCircuitClosed, RemoteCircuitOpened, RemoteRemoved
from blazar.projections.base import Projection, State, TypedState


class RemotesState(TypedState):
    """The `remotes` projection's state, read through `remotes`, `remote` and `serving`."""

    __slots__ = ()


class RemotesProjection(Projection[State]):
    name = "remotes"
    state_type = RemotesState
    version = 1
    types = frozenset({RemoteAdded.TYPE, RemoteRemoved.TYPE, RemoteCircuitOpened.TYPE, RemoteCircuitClosed.TYPE})

    def initial(self) -> State:
        return {"remotes": {}}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        remotes = state["remotes"]
        if isinstance(ev, RemoteAdded):
            remotes[ev.name] = {"name": ev.name, "url": ev.url, "models": list(ev.models),
                                "api_key_env": ev.api_key_env, "max_concurrent": ev.max_concurrent,
                                "added_ts": rec.ts, "circuit_open_until": None, "circuit_reason": None}
        elif isinstance(ev, RemoteRemoved):
            remotes.pop(ev.name, None)
        elif isinstance(ev, RemoteCircuitOpened | RemoteCircuitClosed) and ev.name in remotes:
            r = remotes[ev.name]
            if isinstance(ev, RemoteCircuitOpened):
                r.update(circuit_open_until=ev.open_until, circuit_reason=ev.reason)
            else:
                r.update(circuit_open_until=None, circuit_reason=None)
        return state


@dataclass(frozen=True, slots=True)
class Remote:
    name: str
    url: str
    models: tuple[str, ...]
    api_key_env: str | None
    max_concurrent: int
    added_ts: float
    circuit_open_until: float | None
    circuit_reason: str | None

    def open_at(self, now: float) -> bool:
        return self.circuit_open_until is not None and now < self.circuit_open_until


def _typed(raw: dict[str, Any]) -> Remote:
    return Remote(name=raw["name"], url=raw["url"], models=tuple(raw["models"]), api_key_env=raw["api_key_env"],
                  max_concurrent=raw["max_concurrent"], added_ts=raw["added_ts"],
                  circuit_open_until=raw["circuit_open_until"], circuit_reason=raw["circuit_reason"])


def remotes(state: RemotesState) -> list[Remote]:
    return [_typed(r) for r in sorted(state._raw["remotes"].values(), key=lambda r: r["name"])]


def remote(state: RemotesState, name: str) -> Remote | None:
    raw = state._raw["remotes"].get(name)
    return _typed(raw) if raw is not None else None


def serving(state: RemotesState, model: str) -> Remote | None:
    """The remote registered for `model` (the first by name when several are)."""
    for r in remotes(state):
        if model in r.models:
            return r
    return None
