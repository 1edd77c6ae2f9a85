"""`blazar why`'s words for the swap-aware order's decisions (blazar/events/swaps.py, blazar/serving/swaps.py): a
request whose load waited for busy models, one served ahead of a swap, one that waited behind it."""

from __future__ import annotations

from typing import Any

from blazar.events.swaps import RequestServedAhead, RequestSwapHeld, RequestSwapReleased, RequestSwapWaited


def _s(x: float) -> str:
    return f"{x:g} s"


def swap_held(_: Any, ev: RequestSwapHeld) -> str:
    busy = ", ".join(ev.evicting) or "the loaded models"
    seen = (f"{ev.in_flight} running, {ev.queued} queued there" if ev.in_flight or ev.queued
            else "loading, or its requests on their way to it")
    if ev.position:
        return (f"{ev.model} is not loaded and its room is {busy}'s, busy ({seen}): its swap waits behind "
                f"{ev.position} other swap{'s' if ev.position > 1 else ''}")
    if ev.hold_s > 0:
        return (f"{ev.model} is not loaded and its room is {busy}'s, busy ({seen}): the swap's turn; {busy}'s requests "
                f"may be served ahead of it for at most {_s(ev.hold_s)} (swap_hold_s)")
    return (f"{ev.model} is not loaded and its room is {busy}'s, busy ({seen}): the swap waits for what came before "
            "it to finish (strict order: swap_hold_s 0)")


def served_ahead(_: Any, ev: RequestServedAhead) -> str:
    return (f"served ahead of the swap to {ev.swap_model}, {ev.since_turn_ms / 1000:.1f} s into its hold of "
            f"{_s(ev.hold_s)}: {ev.model} is loaded, so no swap for this request")


def swap_waited(_: Any, ev: RequestSwapWaited) -> str:
    return (f"{ev.model} is loaded but a swap to {ev.swap_model} has had its turn: this request waits behind it, "
            f"and {ev.model} is loaded again in its own turn")


def swap_released(_: Any, ev: RequestSwapReleased) -> str:
    ahead = f"{ev.served_ahead} request{'s' if ev.served_ahead != 1 else ''} served ahead of it"
    if ev.reason == "drained":
        return (f"the swap to {ev.model} goes ahead {ev.held_ms / 1000:.1f} s after its turn: nothing left in its way "
                f"({ahead})")
    return (f"the swap's hold ran out {ev.held_ms / 1000:.1f} s after its turn (swap_hold_s {_s(ev.hold_s)}; {ahead}): "
            "nothing more is served ahead of it, it goes once what runs now is done")


SWAP_TEXT: dict[type, Any] = {
    RequestSwapHeld: swap_held, RequestServedAhead: served_ahead, RequestSwapWaited: swap_waited,
    RequestSwapReleased: swap_released,
}
