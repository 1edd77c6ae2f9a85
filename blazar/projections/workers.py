"""The `workers` projection: every RPC worker a `blazar worker` started (its address, the memory it offers) and
whether it is up now."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from blazar.events.base import Recorded
from blazar.events.workers import WorkerStarted, WorkerStopped
from blazar.projections.base import Projection


@dataclass(frozen=True, slots=True)
class Worker:
    """An RPC worker as its last start and stop left it: the state's entry, handed out as it is."""

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
    crashes: int  # over every start under this name

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(slots=True)
class WorkersState:
    """The `workers` projection's state, read through `workers`."""

    workers: dict[str, Worker] = field(default_factory=dict)  # by name


class WorkersProjection(Projection[WorkersState]):
    name = "workers"
    state_type = WorkersState
    version = 2  # 2: a typed state
    types = frozenset({WorkerStarted.TYPE, WorkerStopped.TYPE})

    def initial(self) -> WorkersState:
        return WorkersState()

    def apply(self, state: WorkersState, rec: Recorded) -> WorkersState:
        ev = rec.event
        workers = state.workers
        if isinstance(ev, WorkerStarted):
            old = workers.get(ev.name)
            workers[ev.name] = Worker(
                name=ev.name, host=ev.host, port=ev.port, mem_bytes=ev.mem_bytes, pid=ev.pid,
                engine_tag=ev.engine_tag, network=ev.network, up=True, started_ts=rec.ts, stopped_ts=None,
                stop_reason=None, crashes=0 if old is None else old.crashes)
        else:
            assert isinstance(ev, WorkerStopped)
            w = workers.get(ev.name)
            if w is not None:
                workers[ev.name] = replace(w, up=False, stopped_ts=rec.ts, stop_reason=ev.reason,
                                           crashes=w.crashes + (ev.reason == "crashed"))
        return state


def workers(state: WorkersState, *, up_only: bool = False) -> list[Worker]:
    """Every worker (or those up now), by name."""
    return [w for _, w in sorted(state.workers.items()) if w.up or not up_only]
