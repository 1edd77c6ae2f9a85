"""The swap-aware order's rule, decided without touching anything (the coordinator is blazar/serving/swaps.py).

A swap is a request's load that needs the room of models busy now: with room for one model, a request for B while A
serves. Swaps wait in the order they came; the first is the head, and its turn is when it became the head. While its
hold runs (`hold_s` from its turn), requests for the models it would evict are still served ahead of it, so a burst
alternating A and B is served A A A, then B B B, instead of a swap at every turn; once the hold is over, those models
take no request ahead of it (the ones served ahead that have no slot yet are recalled), they drain, and the swap goes
ahead. A `hold_s` of 0 is strict order: a request that came after the swap waits behind it. No I/O and no clock: the
caller passes `now` (tests/unit/serving/test_swap_rule.py are tables).
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


# What a request for a model meets in the order: go on (load or use its model as ever), be served ahead of the
# head's swap (its model is one the swap evicts, and the hold runs), wait behind the head's swap (it evicts the
# request's model, and the hold is over), or wait for its own model's swap (queued, or not its turn yet).
Entry = Literal["go", "ahead", "behind", "own"]


def decide_entry(model: str, loaded: bool, swaps: Sequence[Swap], now: float, hold_s: float) -> Entry:
    """What a request for `model` (`loaded`: an instance of it is there now) meets in the order `swaps` (head
    first). A model not loaded while any swap waits takes its place behind them (`own`): a load that jumped the
    queue could evict what the head waits for."""
    if any(s.model == model for s in swaps):
        return "own"
    if not loaded:
        return "own" if swaps else "go"
    head = swaps[0] if swaps else None
    if head is None or model not in head.evicting:
        return "go"
    return "ahead" if in_hold(head, now, hold_s) else "behind"


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
