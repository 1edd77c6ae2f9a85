"""Events about adaptive slots (blazar/serving/slots_governor.py): an instance relaunched at another -np because its
queue stayed full (grow) or empty (shrink). The plan, recorded before anything is done, with the numbers that called
for it and the fit's plan for the new shape; the outcome (the new instance, the requests that waited for it); or the
refusal (the new shape does not fit, the requests in flight did not end in time, the relaunch failed).

They live on the old instance's stream `instance:<id>`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from blazar.events.base import Event
from blazar.events.bounds import OBSERVATIONS, Text
from blazar.events.types import register

Direction = Literal["grow", "shrink"]


@register
class InstanceReshapePlanned(Event):
    """A decision: this instance is to be relaunched at `to_slots`, recorded before new requests are held back. The
    looks that decided it (`looks` in a row, the queue and busy slots at the last, the most requests seen at once)
    and the fit's plan for the new shape beside the old one's."""

    TYPE = "instance.reshape_planned"
    AUDIT = True

    instance_id: str
    model: str
    direction: Direction
    from_slots: int
    to_slots: int
    ctx_tokens: int  # per slot: kept across the reshape
    looks: int  # looks in a row (fit.adaptive_tick_s apart) that called for it
    queued: int  # requests waiting for a slot at the last look
    busy: int  # slots busy at the last look
    peak_demand: int  # the most requests (busy + queued) seen at once in the run
    planned_bytes: int  # the fit's plan for the new shape
    had_bytes: int  # the old shape's plan
    host_free_bytes: int  # what the budget offered the new plan, the old instance's share counted as free

    def stream_key(self) -> str:
        return f"instance:{self.instance_id}"


@register
class InstanceReshaped(Event):
    """The outcome: the instance was relaunched at `to_slots` as `new_instance_id`; the requests it held back
    (`released`, waiting when the new shape opened) went on, none refused or cut."""

    TYPE = "instance.reshaped"
    AUDIT = True

    instance_id: str
    model: str
    new_instance_id: str
    from_slots: int
    to_slots: int
    released: int  # requests waiting in the queue when the new shape opened
    held_ms: int  # from holding new requests back to releasing them

    def stream_key(self) -> str:
        return f"instance:{self.instance_id}"


@register
class InstanceReshapeRefused(Event):
    """A reshape that did not happen, and why: the new shape does not fit (`does_not_fit`, the fit's summary in
    `detail`), the requests in flight did not end within fit.adaptive_drain_s (`busy`: the old shape serves on), or the
    relaunch failed (`failed`)."""

    TYPE = "instance.reshape_refused"
    AUDIT = True

    instance_id: str
    model: str
    direction: Direction
    from_slots: int
    to_slots: int
    reason: Literal["does_not_fit", "busy", "failed"]
    detail: Text
    observations: Annotated[dict[str, Any], OBSERVATIONS] = Field(default_factory=dict)

    def stream_key(self) -> str:
        return f"instance:{self.instance_id}"
