"""Another node as a request's way: whether a request may be forwarded at all, which node has its model ready, whether
forwarding is cheaper than loading here, and the stand-in instance that sends it there (its gateway's URL, the
cluster key, the headers that keep one trace and its tenant). Resolving asks it for a model this node does not store
(blazar/serving/resolve.py), routing for one it stores but has not loaded (blazar/serving/routing.py).
"""

from __future__ import annotations

from typing import Any, Literal

from blazar.cluster.nodes import FORWARD_HEADER, Peer, ready_peer
from blazar.context import Blazar
from blazar.events.requests import RequestForwarded
from blazar.instances.live import Instance
from blazar.serving.call import Call
from blazar.serving.tenancy import TENANT_HEADER, split_session

TRACE_HEADER = "x-blazar-trace-id"
SESSION_HEADER = "x-blazar-session"
# What one more HTTP hop through another node's gateway adds before the first token (bench/nodes.py measures it).
FORWARD_HOP_MS = 5


class Forwarder:
    def __init__(self, app: Blazar, cluster_key: str | None) -> None:
        self.app = app
        self._cluster_key = cluster_key  # forwarding to other nodes needs it

    def may_forward(self, call: Call) -> bool:
        """Whether this request may go to another node at all (a node, the cluster key, not a request already
        forwarded here: one hop at most; not embeddings or rerank, whose instance must be started for them). Cheap:
        asked before anything is looked up."""
        r = call.request
        return (bool(self.app.node) and self._cluster_key is not None and r.forwarded_from is None
                and not r.embeddings and not r.rerank and r.audio is None)

    def peer_for(self, call: Call, model: str, ctx: int | None) -> Peer | None:
        """Another node with `model` ready (with a context of at least `ctx`), where this one may forward."""
        if not self.may_forward(call):
            return None
        return ready_peer(self.app, model, ctx=ctx)

    @staticmethod
    def cheaper(peer: Peer) -> dict[str, Any] | None:
        """What the decision to forward rather than load here saw, or None when loading here is cheaper: forwarding
        costs one more HTTP hop (about a millisecond on a LAN: BENCHMARK.md), loading here what it took there."""
        if peer.load_ms is None or peer.load_ms > FORWARD_HOP_MS:
            return {"peer_load_ms": peer.load_ms, "hop_ms_estimate": FORWARD_HOP_MS}
        return None

    def instance(self, call: Call, peer: Peer, reason: Literal["ready_there", "not_stored_here"],
                 observations: dict[str, Any]) -> Instance:
        """The stand-in instance for the node where the model is ready: its gateway's URL, the cluster key, and the
        headers that make it one trace (the hop's events share this trace id); the decision recorded."""
        assert self._cluster_key is not None
        call.emit(RequestForwarded(trace_id=call.trace_id, model=call.model, node=peer.node, url=peer.url,
                                   instance_id=peer.instance_id, reason=reason,
                                   observations={**observations, "peer_slots": peer.slots,
                                                 "peer_ctx_tokens": peer.ctx_tokens}))
        return Instance(instance_id=f"node:{peer.node}", model=call.model, port=0, slots=peer.slots,
                        ctx_tokens=peer.ctx_tokens, engine_tag=f"node:{peer.node}", api_key=self._cluster_key,
                        served_as=call.model, url=peer.url,
                        headers={FORWARD_HEADER: self.app.node, TRACE_HEADER: call.trace_id, **_hop_tenancy(call)})


def _hop_tenancy(call: Call) -> dict[str, str]:
    """What the peer needs to keep the request's tenant apart there too: the tenant this node found, and the session
    by the name its client gave (the peer puts it in the same namespace)."""
    request = call.request
    headers = {TENANT_HEADER: request.tenant} if request.tenant is not None else {}
    if request.session is not None:
        headers[SESSION_HEADER] = split_session(request.session)[1]
    return headers
