"""What a call records to and gives back to (blazar/serving/call.py's `Desk`), for the gateway: its request events
to the group-commit writer, its slot to admission, its instance's hold to the supervisor (and the swap order, which
may wait for that instance to drain), its key's lease and usage to the limiter, and its finished turn to the prefix
watch. One per gateway; no decisions of its own.
"""

from __future__ import annotations

from blazar.context import Blazar, stamp_node
from blazar.events.base import Event
from blazar.instances.live import Instance
from blazar.serving.admission import Admission, Ticket
from blazar.serving.call import Call, Completed
from blazar.serving.limits import Lease, Limiter
from blazar.serving.ports import SupervisorPort
from blazar.serving.prefix_watch import PrefixWatch
from blazar.serving.swaps import SwapOrder


class GatewayDesk:
    def __init__(self, app: Blazar, admission: Admission, supervisor: SupervisorPort, limits: Limiter,
                 swaps: SwapOrder, prefixes: PrefixWatch) -> None:
        self.app = app
        self.admission = admission
        self.supervisor = supervisor
        self.limits = limits
        self.swaps = swaps
        self.prefixes = prefixes
        self._writer = app.request_writer()
        self._actor = app.actor

    def emit(self, event: Event, trace_id: str, actor: str | None = None) -> None:
        """Hand a request event to the group-commit writer; its actor is the caller's key ("key:<name>") where keys
        are on, else the daemon's."""
        if self.app.node:  # a session's save or restore is the node's own (its files are here)
            event = stamp_node(event, self.app.node)
        self._writer.submit(event, actor=actor or self._actor, trace_id=trace_id)

    def release_slot(self, ticket: Ticket, *, tokens: int | None = None, charged: int | None = None) -> None:
        self.admission.release(ticket, tokens=tokens, charged=charged)

    def give_back_slot(self, ticket: Ticket) -> None:
        self.admission.give_back(ticket)

    def unhold(self, instance: Instance) -> None:
        self.supervisor.unhold(instance)
        self.swaps.nudge()  # a swap may wait for this instance to drain

    def release_lease(self, lease: Lease) -> None:
        self.limits.release(lease)

    def charge(self, key_name: str, tokens: int) -> None:
        self.limits.add_tokens(key_name, tokens)

    def charge_audio(self, key_name: str, seconds: float) -> None:
        self.limits.add_audio(key_name, seconds)

    def turn_done(self, call: Call, done: Completed) -> None:
        self.prefixes.observe(call, done)
