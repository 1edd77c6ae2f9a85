"""The `nodes` projection: every gateway that has joined the shared log, the URL it is reached at (and whether it
was started to let the cluster key travel in clear), whether it is up, when it was last heard from and, when down,
why."""

from __future__ import annotations

from dataclasses import dataclass

from blazar.events.base import Recorded
from blazar.events.nodes import NodeDown, NodeHeartbeat, NodeStarted, NodeStopped
from blazar.projections.base import Projection, State, TypedState


class NodesState(TypedState):
    """The `nodes` projection's state, read through `nodes` and `node`."""

    __slots__ = ()


class NodesProjection(Projection[State]):
    name = "nodes"
    state_type = NodesState
    version = 2
    types = frozenset({NodeStarted.TYPE, NodeHeartbeat.TYPE, NodeStopped.TYPE, NodeDown.TYPE})

    def initial(self) -> State:
        return {"nodes": {}}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        nodes = state["nodes"]
        if isinstance(ev, NodeStarted):
            nodes[ev.name] = {"name": ev.name, "url": ev.url, "pid": ev.pid, "host": ev.host, "version": ev.version,
                              "up": True, "started_ts": rec.ts, "last_seen_ts": rec.ts, "instances": 0,
                              "in_flight": 0, "down_reason": None, "down_ts": None, "noticed_by": None,
                              "stopped_ts": None, "insecure_cluster": ev.insecure_cluster}
            return state
        assert isinstance(ev, NodeHeartbeat | NodeStopped | NodeDown)
        n = nodes.get(ev.name)
        if n is None:
            return state  # a heartbeat or a verdict about a node this log never saw start: nothing to update
        if isinstance(ev, NodeHeartbeat):
            if n["up"]:  # a heartbeat racing its own down-marking does not bring a node back: node.started does
                n.update(last_seen_ts=rec.ts, instances=ev.instances, in_flight=ev.in_flight)
        elif isinstance(ev, NodeStopped):
            n.update(up=False, stopped_ts=rec.ts, down_reason="stopped", down_ts=rec.ts, noticed_by=None)
        else:
            assert isinstance(ev, NodeDown)
            if n["up"]:  # two nodes may notice the same silence: the first verdict stands
                n.update(up=False, down_reason=ev.detail or ev.reason, down_ts=rec.ts, noticed_by=ev.noticed_by)
        return state


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    url: str
    pid: int
    host: str
    version: str
    up: bool
    started_ts: float
    last_seen_ts: float
    instances: int
    in_flight: int
    down_reason: str | None
    down_ts: float | None
    noticed_by: str | None
    stopped_ts: float | None
    insecure_cluster: bool = False


def nodes(state: NodesState, *, up_only: bool = False) -> list[Node]:
    out = [Node(**n) for n in sorted(state._raw["nodes"].values(), key=lambda n: n["name"])]
    return [n for n in out if n.up] if up_only else out


def node(state: NodesState, name: str) -> Node | None:
    n = state._raw["nodes"].get(name)
    return Node(**n) if n is not None else None
