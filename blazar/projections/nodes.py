"""The `nodes` projection: every gateway that has joined the shared log, the URL it is reached at (and whether it
was started to let the cluster key travel in clear), whether it is up, when it was last heard from and, when down,
why."""

from __future__ import annotations

from dataclasses import dataclass, field

from blazar.events.base import Recorded
from blazar.events.nodes import NodeDown, NodeHeartbeat, NodeStarted, NodeStopped
from blazar.projections.base import Projection


@dataclass(slots=True)
class Node:
    """A gateway as the log last told of it: the state's own entry, updated in place by each heartbeat (a replay
    folds every one of them, so no copy per heartbeat). Readers hand it out to be read, never changed."""

    name: str
    url: str
    pid: int
    host: str
    version: str
    up: bool
    started_ts: float
    last_seen_ts: float
    instances: int = 0
    in_flight: int = 0
    down_reason: str | None = None
    down_ts: float | None = None
    noticed_by: str | None = None
    stopped_ts: float | None = None
    insecure_cluster: bool = False


@dataclass(slots=True)
class NodesState:
    """The `nodes` projection's state, read through `nodes` and `node`."""

    nodes: dict[str, Node] = field(default_factory=dict)


class NodesProjection(Projection[NodesState]):
    name = "nodes"
    state_type = NodesState
    version = 3
    types = frozenset({NodeStarted.TYPE, NodeHeartbeat.TYPE, NodeStopped.TYPE, NodeDown.TYPE})

    def initial(self) -> NodesState:
        return NodesState()

    def apply(self, state: NodesState, rec: Recorded) -> NodesState:
        ev = rec.event
        nodes = state.nodes
        if isinstance(ev, NodeStarted):
            nodes[ev.name] = Node(name=ev.name, url=ev.url, pid=ev.pid, host=ev.host, version=ev.version, up=True,
                                  started_ts=rec.ts, last_seen_ts=rec.ts, insecure_cluster=ev.insecure_cluster)
            return state
        assert isinstance(ev, NodeHeartbeat | NodeStopped | NodeDown)
        n = nodes.get(ev.name)
        if n is None:
            return state  # a heartbeat or a verdict about a node this log never saw start: nothing to update
        if isinstance(ev, NodeHeartbeat):
            if n.up:  # a heartbeat racing its own down-marking does not bring a node back: node.started does
                n.last_seen_ts, n.instances, n.in_flight = rec.ts, ev.instances, ev.in_flight
        elif isinstance(ev, NodeStopped):
            n.up, n.stopped_ts, n.down_reason, n.down_ts, n.noticed_by = False, rec.ts, "stopped", rec.ts, None
        else:
            assert isinstance(ev, NodeDown)
            if n.up:  # two nodes may notice the same silence: the first verdict stands
                n.up, n.down_reason, n.down_ts, n.noticed_by = False, ev.detail or ev.reason, rec.ts, ev.noticed_by
        return state


def nodes(state: NodesState, *, up_only: bool = False) -> list[Node]:
    out = [state.nodes[name] for name in sorted(state.nodes)]
    return [n for n in out if n.up] if up_only else out


def node(state: NodesState, name: str) -> Node | None:
    return state.nodes.get(name)
