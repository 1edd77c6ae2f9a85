"""The swap-aware order's rule as tables (blazar/serving/swap_rule.py): what a request for a model meets in the order
of waiting swaps, and what the head swap does now, at a given moment (no clock: `now` is a number)."""

from __future__ import annotations

import pytest

from blazar.serving.swap_rule import Entry, Step, Swap, decide_entry, decide_head, hold_left_s

B_OVER_A = Swap("b", frozenset({"a"}), turn_at=100.0)  # a swap to b that evicts a; its turn came at t=100
C_OVER_A = Swap("c", frozenset({"a"}), turn_at=None)  # behind it


B_THEN_A = [B_OVER_A, Swap("a", frozenset(), turn_at=None)]  # strict order: b's turn, then a's


@pytest.mark.parametrize(("model", "loaded", "swaps", "now", "hold_s", "want"), [
    ("a", True, [], 100.0, 10.0, "go"),  # nothing waits: as ever
    ("b", False, [], 100.0, 10.0, "go"),  # not loaded and nothing waits: load it (or learn what is in the way)
    ("a", True, [B_OVER_A], 105.0, 10.0, "ahead"),  # a is what b evicts, and b's hold runs: served ahead
    ("a", True, [B_OVER_A], 110.0, 10.0, "queue"),  # the hold ran out at 110: a turn of its own, after b's
    ("a", True, [B_OVER_A], 100.0, 0.0, "queue"),  # strict order: no hold, a request after the swap waits its turn
    ("d", True, [B_OVER_A], 105.0, 10.0, "go"),  # a loaded model the swap does not evict
    ("b", False, [B_OVER_A], 105.0, 10.0, "join"),  # b's turn is the last: joined
    ("c", False, [B_OVER_A], 105.0, 10.0, "queue"),  # not loaded while a swap waits: a turn behind it
    ("b", False, B_THEN_A, 100.0, 0.0, "queue"),  # b's turn is not the last: a new one, after a's (as it came)
    ("a", True, B_THEN_A, 100.0, 0.0, "join"),
    ("a", True, B_THEN_A, 105.0, 10.0, "ahead"),  # in the hold a loaded a goes ahead, turn or no turn
    ("a", True, [C_OVER_A], 105.0, 10.0, "queue"),  # a head whose turn has not started holds nothing
    ("d", True, [Swap("b", frozenset(), 100.0)], 105.0, 10.0, "queue"),  # the head has not learnt what it evicts
    # b loaded by the head's own turn (loading now) while a's turn and another b turn wait: that b waits its turn.
    ("b", True, [B_OVER_A, Swap("a", frozenset(), None), Swap("b", frozenset(), None)], 101.0, 0.0, "join"),
])
def test_what_a_request_meets_in_the_order(model: str, loaded: bool, swaps: list[Swap], now: float, hold_s: float,
                                           want: Entry) -> None:
    assert decide_entry(model, loaded, swaps, now, hold_s) == want


@pytest.mark.parametrize(("demand", "now", "hold_s", "want"), [
    (0, 101.0, 10.0, "try"),  # nothing left on a: the swap goes ahead, in its hold or not
    (0, 500.0, 10.0, "try"),
    (3, 109.999, 10.0, "hold"),  # a still has requests and the hold runs: they are served
    (3, 110.0, 10.0, "expired"),  # the hold is over: recall what has no slot, wait for the rest to end
    (1, 100.0, 0.0, "expired"),  # strict order: no hold at all
])
def test_what_the_head_swap_does_now(demand: int, now: float, hold_s: float, want: Step) -> None:
    assert decide_head(B_OVER_A, demand, now, hold_s) == want


def test_the_hold_left_counts_from_the_turn() -> None:
    assert hold_left_s(B_OVER_A, 104.0, 10.0) == 6.0
    assert hold_left_s(B_OVER_A, 110.0, 10.0) is None
    assert hold_left_s(C_OVER_A, 104.0, 10.0) is None
    assert hold_left_s(B_OVER_A, 100.0, 0.0) is None
