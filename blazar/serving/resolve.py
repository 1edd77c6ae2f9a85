"""Which model a call's step asks for, as a `Route` without an instance (blazar/serving/route.py): this node's store's,
else a remote engine's, else one only another node stores; and whether that model serves the route asked for. The
first of a request's checks (blazar/serving/checks.py); a cascade's later models are resolved here too, in the key's
scope. A refusal is raised (`Refused`) for `Gateway.serve` to end the call with.
"""

from __future__ import annotations

from blazar.adapters.engines.kinds import engine_kind, route_of
from blazar.cluster.remotes import resolved_remote
from blazar.context import Blazar
from blazar.errors import ModelNotFound, Refused
from blazar.instances.live import ResolvedModel
from blazar.projections.remotes import serving
from blazar.serving.call import Call
from blazar.serving.forwarding import Forwarder
from blazar.serving.ports import SupervisorPort
from blazar.serving.principal import scope_refusal
from blazar.serving.rerank import refuse_unless_reranker
from blazar.serving.route import Route


class Resolver:
    def __init__(self, app: Blazar, supervisor: SupervisorPort, forwarder: Forwarder) -> None:
        self.app = app
        self.supervisor = supervisor
        self.forwarder = forwarder

    def resolve(self, call: Call) -> Route:
        """The call's model: this node's store's, else a remote engine's, else one only another node stores; a 404
        when none has it."""
        model = call.model
        try:
            return Route(model, self.supervisor.resolve(model))
        except ModelNotFound as e:
            served = serving(self.app.runner.state("remotes"), model)
            if served is not None:
                return Route(model, resolved_remote(model), remote=served.name)
            peer = self.forwarder.peer_for(call, model, call.ask.ctx)
            if peer is None:
                raise Refused(e.message, reason="model_not_found", http_status=404) from None
            return Route(model, resolved_remote(model), peer=peer)  # not stored here: only there

    def check_kind(self, call: Call) -> None:
        """The model of this store serves the route (a chat to a whisper model is refused), and a rerank request's
        model reranks; a remote engine's or another node's answers for itself. After the key's scope: a key learns
        nothing of a model it may not use."""
        if call.route.elsewhere:
            return
        refuse_unless_served(call.route.resolved, call.request.engine_path)
        if call.request.rerank:
            refuse_unless_reranker(call.route.resolved)

    def in_scope(self, call: Call, name: str) -> Route:
        """A cascade's model `name`: the store's, else a remote engine's, in the key's scope."""
        try:
            route = Route(name, self.supervisor.resolve(name))
        except ModelNotFound as e:
            served = serving(self.app.runner.state("remotes"), name)
            if served is None:
                raise Refused(f"cascade: {e.message}", reason="model_not_found", http_status=404) from None
            route = Route(name, resolved_remote(name), remote=served.name)
        p = call.request.principal
        if p is not None and p.key is not None and not p.allows(name, route.name):
            raise Refused(scope_refusal(p, name, route.name), reason="model_not_allowed", http_status=403,
                          error_type="permission_error")
        return route


def refuse_unless_served(model: ResolvedModel, engine_path: str) -> None:
    """Refused (400), before any load, when the model's kind does not serve the route asked for (a chat to a whisper
    model): the message names the model, its kind and the routes it does serve."""
    route = route_of(engine_path)
    kind = engine_kind(model.kind)
    if route is None or kind.serves(route):
        return
    raise Refused(kind.refusal(model.name), reason="model_kind_mismatch", http_status=400,
                  error_type="invalid_request_error",
                  observations={"kind": kind.name, "route": route, "serves": sorted(kind.routes)})
