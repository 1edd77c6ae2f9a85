"""Swap events: the swap-aware order's decisions (blazar/serving/swaps.py), each on the trace of the request it
concerns, so `blazar why TRACE` tells them. A swap is a request's load that needs the room of models busy now (with
room for one model, a request for B while A serves); it waits for them in the order swaps came, and while its hold
runs (`queue.swap_hold_s` from its turn) requests for the models it would evict are served ahead of it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from blazar.events.bounds import NAME, items
from blazar.events.requests import RequestEvent
from blazar.events.types import register

# The most busy models a swap names as in its way (with room for one model, one).
MAX_EVICTING = 8


@register
class RequestSwapHeld(RequestEvent):
    """A decision: the request's model is not loaded and loading it needs the room of `evicting`, busy now
    (`in_flight` requests running, `queued` waiting for their slots): the load waits in the swap order, `position`
    swaps behind the one whose turn it is (0: its own turn: its hold of `hold_s` starts now; 0 s is strict order)."""

    TYPE = "request.swap_held"

    model: str
    evicting: Annotated[list[str], items(MAX_EVICTING, NAME)] = Field(default_factory=list, max_length=MAX_EVICTING)
    position: int = 0
    hold_s: float = 0.0
    in_flight: int = 0
    queued: int = 0


@register
class RequestServedAhead(RequestEvent):
    """A decision: the request's model is loaded, and a swap to `swap_model` that would evict it waits in its hold:
    the request is served ahead of that swap, `since_turn_ms` after the swap's turn (always under `hold_s`). Once the
    hold runs out, one that has not taken a slot yet is recalled (`request.rerouted`, reason `swap_recalled`)."""

    TYPE = "request.served_ahead"

    model: str
    swap_model: str
    since_turn_ms: float
    hold_s: float


@register
class RequestSwapWaited(RequestEvent):
    """A decision: the request's model is loaded, but a swap to `swap_model` that evicts it has had its turn and its
    hold is over (or there is none, strict order): the request waits behind the swap, and its model is loaded again
    in its own turn."""

    TYPE = "request.swap_waited"

    model: str
    swap_model: str


@register
class RequestSwapReleased(RequestEvent):
    """The hold on the request's swap ended, `held_ms` after the swap's turn: `drained` (the models it evicts had no
    request left, so the swap goes ahead) or `expired` (`hold_s` ran out: those models take no request ahead of it
    any more, and it goes ahead once what they run now is done). `served_ahead`: the requests served ahead of the
    swap in its hold."""

    TYPE = "request.swap_released"

    model: str
    reason: Literal["drained", "expired"]
    held_ms: float
    hold_s: float
    served_ahead: int = 0
