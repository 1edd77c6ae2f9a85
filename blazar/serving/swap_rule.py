"""The swap-aware order's rule, decided without touching anything (the coordinator is blazar/serving/swaps.py).

A swap is a request's load that needs the room of models busy now: with room for one model, a request for B while A
serves. Swaps wait in the order they came; the first is the head, and its turn is when it became the head. While its
hold runs (`hold_s` from its turn), requests for the models it would evict are still served ahead of it, so a burst
alternating A and B is served A A A, then B B B, instead of a swap at every turn; once the hold is over, those models
take no request ahead of it (the ones served ahead that have no slot yet are recalled), they drain, and the swap goes
ahead. A `hold_s` of 0 is strict order: every request in its turn, as it came. No I/O and no clock: the caller passes
`now` (tests/unit/serving/test_swap_rule.py are tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Swap:
    """A waiting swap as the rule sees it: the model it loads, the busy models it evicts, and its turn (the moment it
    became the head of the order; None while a swap ahead of it waits)."""

    model: str
    evicting: frozenset[str]
    turn_at: float | None


# What a request for a model meets in the order: go on (use or load its model as ever), be served ahead of the head
# swap (its model is loaded, the head would evict it, and the head's hold runs), join the last swap waiting (it is for
# the same model), or queue a new swap at the end (its model, loaded or not now, is loaded in its turn).
Entry = Literal["go", "ahead", "join", "queue"]


def decide_entry(model: str, loaded: bool, swaps: Sequence[Swap], now: float, hold_s: float) -> Entry:
    """What a request for `model` (`loaded`: an instance of it is there now) meets in the order `swaps` (head
    first). The order is first come, first served, by turns: a request joins the last turn when it is its model's,
    else takes a new one; so with no hold, requests alternating two models with room for one swap at every turn,
    as they came. A loaded model the head does not evict, with no turn waiting, goes on (nothing waits for its
    room); one the head evicts goes ahead of it while the hold runs. A model loaded early (a turn before its own
    loaded it) does not make a later turn of it go: in strict order that would pass the turns between them."""
    if not swaps:
        return "go"
    head = swaps[0]
    if loaded and head.evicting and model not in head.evicting and all(s.model != model for s in swaps):
        return "go"
    if loaded and model in head.evicting and in_hold(head, now, hold_s):
        return "ahead"
    return "join" if swaps[-1].model == model else "queue"


def in_hold(head: Swap, now: float, hold_s: float) -> bool:
    """Whether the head's hold still runs at `now`: `hold_s` from its turn (never, with a `hold_s` of 0)."""
    return head.turn_at is not None and now < head.turn_at + hold_s


# What the head's swap does now: try its load (the models it evicts have no request left: running or waiting), wait
# in its hold, or wait for them to drain with its hold over (`expired`: recall what was served ahead without a slot).
Step = Literal["try", "hold", "expired"]


def decide_head(head: Swap, demand: int, now: float, hold_s: float) -> Step:
    """The head's step, given `demand`: the requests running on and waiting for the models it evicts."""
    if demand == 0:
        return "try"
    return "hold" if in_hold(head, now, hold_s) else "expired"


def hold_left_s(head: Swap, now: float, hold_s: float) -> float | None:
    """Seconds until the head's hold runs out; None when it is over (or never ran)."""
    if not in_hold(head, now, hold_s):
        return None
    assert head.turn_at is not None
    return head.turn_at + hold_s - now
