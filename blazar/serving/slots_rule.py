"""The adaptive slots rule, pure: one look at an instance's queue in, a reshape (grow or shrink its -np) or nothing out.
The governor (blazar/serving/slots_governor.py) takes the looks, plans the new shape with the fit and records it.

The rule, per instance, one look every `fit.adaptive_tick_s`:
1. Pressure: every slot busy and requests queued. `grow_after` looks in a row under pressure grow the instance to
   the most requests seen wanting it at once (at least one slot more), capped at `max_slots`.
2. Quiet: nothing queued and no more slots busy than its first shape had (`base`: what the load gave it). After
   `shrink_after` quiet looks in a row an instance that grew goes back to `base`, its memory returned.
A look that is neither (busy beyond the base shape but no queue) breaks both runs: the shape that serves it now stays.
No clock: the looks are counted, so the tests are tables (tests/unit/serving/test_slots_rule.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal


@dataclass(frozen=True, slots=True)
class SlotsRule:
    """The thresholds (settings fit.adaptive_*)."""

    max_slots: int = 8
    grow_after: int = 6
    shrink_after: int = 30


@dataclass(frozen=True, slots=True)
class SlotsLook:
    """One look at an instance's lane in admission."""

    slots: int  # its -np now
    busy: int  # slots held
    queued: int  # requests waiting for one

    @property
    def pressured(self) -> bool:
        return self.queued > 0 and self.busy >= self.slots


@dataclass(frozen=True, slots=True)
class SlotsState:
    """What the rule remembers between looks at one instance."""

    pressured: int = 0  # looks in a row under pressure
    quiet: int = 0  # looks in a row that the base shape would have served without a queue
    peak_demand: int = 0  # the most requests (busy + queued) seen in the pressured run


@dataclass(frozen=True, slots=True)
class Reshape:
    """Relaunch the instance at `to_slots`; `looks` is the run of looks that decided it."""

    direction: Literal["grow", "shrink"]
    from_slots: int
    to_slots: int
    looks: int
    peak_demand: int


def decide_slots(state: SlotsState, look: SlotsLook, rule: SlotsRule, base: int) -> tuple[SlotsState, Reshape | None]:
    """The state after `look`, and the reshape it calls for (None: the shape stays). `base` is the slots the
    instance's first shape had (what a load without adaptive slots gives it)."""
    if look.pressured:
        state = SlotsState(pressured=state.pressured + 1, quiet=0,
                           peak_demand=max(state.peak_demand, look.busy + look.queued))
        if state.pressured < rule.grow_after or look.slots >= rule.max_slots:
            return state, None
        to = min(rule.max_slots, max(look.slots + 1, state.peak_demand))
        return SlotsState(), Reshape("grow", look.slots, to, state.pressured, state.peak_demand)
    if look.queued == 0 and look.busy <= base:
        state = replace(state, pressured=0, quiet=state.quiet + 1, peak_demand=0)
        if state.quiet < rule.shrink_after or look.slots <= base:
            return state, None
        return SlotsState(), Reshape("shrink", look.slots, base, state.quiet, look.busy)
    return SlotsState(), None
