"""A realtime session's turns recorded in the log (`GatewayTurns`, the session's `TurnRecorder`): each turn's
`realtime.turn` event (blazar/serving/realtime/facts.py) through the request writer, as the connection's key, on the
turn's own trace, as a Call's events go (blazar/serving/desk.py)."""

from __future__ import annotations

from blazar.context import Blazar, stamp_node
from blazar.events.base import Event
from blazar.serving.principal import Principal
from blazar.serving.realtime.facts import TurnFacts, TurnModels, turn_event
from blazar.serving.tenancy import tenant_of


class GatewayTurns:
    def __init__(self, app: Blazar, models: TurnModels, principal: Principal | None) -> None:
        self.app = app
        self.models = models
        self.principal = principal

    def record(self, facts: TurnFacts) -> None:
        event: Event = turn_event(facts, self.models, tenant_of(self.principal))
        if self.app.node:
            event = stamp_node(event, self.app.node)
        actor = self.principal.actor if self.principal is not None else None
        self.app.request_writer().submit(event, actor=actor or self.app.actor, trace_id=facts.trace_id)
