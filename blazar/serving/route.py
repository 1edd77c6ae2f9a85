"""Where one step of a call runs, as one value: what resolving decided (the model by the client's name, the store's
entry for it, a remote engine or another node that serves it) and what routing added (the instance, the cold load the
request waited for). Resolving (blazar/serving/resolve.py) returns a Route without an instance, routing
(blazar/serving/routing.py) returns it with one; the Call keeps the latest (`Call.take_route`) and its readers ask it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from blazar.instances.live import Instance, ResolvedModel

if TYPE_CHECKING:
    from blazar.cluster.nodes import Peer


@dataclass(frozen=True, slots=True)
class Route:
    model: str  # the client's name for the step's model: every answer carries it
    resolved: ResolvedModel  # the store's entry (a stand-in for a model served elsewhere)
    remote: str | None = None  # the remote engine serving the model (not in the store), by its name
    peer: Peer | None = None  # the node this request is forwarded to, where the model is ready
    instance: Instance | None = None  # once routed
    load_ms: float | None = None  # the cold load this request waited for, if any

    @property
    def name(self) -> str:
        """The store's name for the model."""
        return self.resolved.name

    @property
    def elsewhere(self) -> bool:
        """Served by a remote engine or another node, which answers for itself (its kind, its media)."""
        return self.remote is not None or self.peer is not None

    def forwarded(self, peer: Peer) -> Route:
        """The way to another node where the model is ready (routing's choice, not resolving's)."""
        return replace(self, peer=peer)

    def to(self, instance: Instance | None, load_ms: float | None = None) -> Route:
        """The route on `instance` (None: not routed yet, or routed again)."""
        return replace(self, instance=instance, load_ms=load_ms)
