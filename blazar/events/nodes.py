"""Nodes: the gateways sharing one log (on PostgreSQL), each with a name, the URL the others reach it at, and a
heartbeat. A node that misses heartbeats is marked down by another, with the reason and the instances it took with
it (they are lost: their processes may be gone with their host). Stream `node:<name>`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from blazar.events.base import Event
from blazar.events.bounds import ID, URL, Text, items
from blazar.events.types import register


class _NodeEvent(Event):
    name: str

    def stream_key(self) -> str:
        return f"node:{self.name}"


@register
class NodeStarted(_NodeEvent):
    """A daemon joined as node `name` (again, after a restart or after it was marked down)."""

    TYPE = "node.started"
    AUDIT = True

    url: Annotated[str, URL]
    pid: int
    host: str  # the machine's host name
    version: str = ""
    rejoined: bool = False  # it found itself marked down while alive (a partition) and joined again
    # Started with --insecure-cluster: the cluster key may travel in clear (plain http off the machine), to this node
    # and from it when it forwards or asks another node.
    insecure_cluster: bool = False


@register
class NodeHeartbeat(_NodeEvent):
    """The node is alive: appended every `node_heartbeat_s` (group commit: a heartbeat lost in a crash is what the
    crash means)."""

    TYPE = "node.heartbeat"
    ARCHIVABLE = True

    instances: int = 0  # its live instances, for `blazar node list`
    in_flight: int = 0


@register
class NodeStopped(_NodeEvent):
    """The node's daemon stopped cleanly (its instances stopped first, each with its own event)."""

    TYPE = "node.stopped"
    AUDIT = True


@register
class NodeDown(_NodeEvent):
    """Another node found `name` silent for longer than `node_down_after_s`: it is down, and every instance it ran
    is lost (the residency projection drops them, so the next request loads the model where it fits)."""

    TYPE = "node.down"
    AUDIT = True

    reason: Literal["missed_heartbeats"] = "missed_heartbeats"
    detail: Text = ""
    last_seen_ts: float | None = None
    noticed_by: str
    instances_lost: Annotated[list[str], items(64, ID)] = Field(default_factory=list)
