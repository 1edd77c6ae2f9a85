"""The `workers` projection: every RPC worker a `blazar worker` started (its address, the memory it offers) and
whether it is up now."""

from __future__ import annotations

from dataclasses import dataclass

from blazar.events.base import Recorded
from blazar.events.workers import WorkerStarted, WorkerStopped
from blazar.projections.base import Projection, State, TypedState


class WorkersState(TypedState):
    """The `workers` projection's state, read through `workers`."""

    __slots__ = ()


class WorkersProjection(Projection[State]):
    name = "workers"
    state_type = WorkersState
    version = 1
    types = frozenset({WorkerStarted.TYPE, WorkerStopped.TYPE})

    def initial(self) -> State:
        return {"workers": {}}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        workers = state["workers"]
        if isinstance(ev, WorkerStarted):
            old = workers.get(ev.name) or {"crashes": 0}
            workers[ev.name] = {"name": ev.name, "host": ev.host, "port": ev.port, "mem_bytes": ev.mem_bytes,
                                "pid": ev.pid, "engine_tag": ev.engine_tag, "network": ev.network, "up": True,
                                "started_ts": rec.ts, "stopped_ts": None, "stop_reason": None,
                                "crashes": old["crashes"]}
        else:
            assert isinstance(ev, WorkerStopped)
            w = workers.get(ev.name)
            if w is not None:
                w.update(up=False, stopped_ts=rec.ts, stop_reason=ev.reason)
                if ev.reason == "crashed":
                    w["crashes"] += 1
        return state


@dataclass(frozen=True, slots=True)
class Worker:
    name: str
    host: str
    port: int
    mem_bytes: int
    pid: int
    engine_tag: str
    network: bool
    up: bool
    started_ts: float
    stopped_ts: float | None
    stop_reason: str | None
    crashes: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def workers(state: WorkersState, *, up_only: bool = False) -> list[Worker]:
    out = [Worker(**w) for w in sorted(state._raw["workers"].values(), key=lambda w: w["name"])]
    return [w for w in out if w.up] if up_only else out
