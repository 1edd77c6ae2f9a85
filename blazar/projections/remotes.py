"""The `remotes` projection: every registered remote engine (its URL, models, the name of its key's environment
variable, its concurrency) and its circuit, and which model each remote serves."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from blazar.events.base import Recorded
from blazar.events.remotes import RemoteAdded, RemoteCircuitClosed, RemoteCircuitOpened, RemoteRemoved
from blazar.projections.base import Projection


@dataclass(frozen=True, slots=True)
class Remote:
    name: str
    url: str
    models: tuple[str, ...]
    api_key_env: str | None
    max_concurrent: int
    added_ts: float
    circuit_open_until: float | None = None
    circuit_reason: str | None = None

    def open_at(self, now: float) -> bool:
        return self.circuit_open_until is not None and now < self.circuit_open_until


@dataclass(slots=True)
class RemotesState:
    """The `remotes` projection's state, read through `remotes`, `remote` and `serving`."""

    remotes: dict[str, Remote] = field(default_factory=dict)


class RemotesProjection(Projection[RemotesState]):
    name = "remotes"
    state_type = RemotesState
    version = 2
    types = frozenset({RemoteAdded.TYPE, RemoteRemoved.TYPE, RemoteCircuitOpened.TYPE, RemoteCircuitClosed.TYPE})

    def initial(self) -> RemotesState:
        return RemotesState()

    def apply(self, state: RemotesState, rec: Recorded) -> RemotesState:
        ev = rec.event
        remotes = state.remotes
        if isinstance(ev, RemoteAdded):
            remotes[ev.name] = Remote(name=ev.name, url=ev.url, models=tuple(ev.models), api_key_env=ev.api_key_env,
                                      max_concurrent=ev.max_concurrent, added_ts=rec.ts)
        elif isinstance(ev, RemoteRemoved):
            remotes.pop(ev.name, None)
        elif isinstance(ev, RemoteCircuitOpened | RemoteCircuitClosed) and (r := remotes.get(ev.name)) is not None:
            if isinstance(ev, RemoteCircuitOpened):
                remotes[ev.name] = replace(r, circuit_open_until=ev.open_until, circuit_reason=ev.reason)
            else:
                remotes[ev.name] = replace(r, circuit_open_until=None, circuit_reason=None)
        return state


def remotes(state: RemotesState) -> list[Remote]:
    return [state.remotes[n] for n in sorted(state.remotes)]


def remote(state: RemotesState, name: str) -> Remote | None:
    return state.remotes.get(name)


def serving(state: RemotesState, model: str) -> Remote | None:
    """The remote registered for `model` (the first by name when several are)."""
    for r in remotes(state):
        if model in r.models:
            return r
    return None
