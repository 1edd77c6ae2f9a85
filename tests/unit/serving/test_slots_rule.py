"""The adaptive slots rule (blazar/serving/slots_rule.py): looks at a queue in, a grow, a shrink or nothing out."""

from __future__ import annotations

import pytest

from blazar.serving.slots_rule import Reshape, SlotsLook, SlotsRule, SlotsState, decide_slots

RULE = SlotsRule(max_slots=8, grow_after=3, shrink_after=4)


def run(looks: list[SlotsLook], base: int = 1, state: SlotsState = SlotsState()) -> list[Reshape | None]:
    out: list[Reshape | None] = []
    for look in looks:
        state, reshape = decide_slots(state, look, RULE, base)
        out.append(reshape)
    return out


def test_sustained_pressure_grows_to_the_peak_demand_after_grow_after_looks() -> None:
    got = run([SlotsLook(1, 1, 3), SlotsLook(1, 1, 7), SlotsLook(1, 1, 5)])
    assert got[:2] == [None, None]
    assert got[2] == Reshape("grow", 1, 8, 3, 8)


@pytest.mark.parametrize(("looks", "to"), [
    ([SlotsLook(2, 2, 1)] * 3, 3),  # demand 3 on 2 slots: one more
    ([SlotsLook(4, 4, 1)] * 3, 5),
    ([SlotsLook(4, 4, 40)] * 3, 8),  # capped at max_slots
    ([SlotsLook(1, 1, 1)] * 3, 2),  # a queue of one: at least one slot more
])
def test_the_grown_shape(looks: list[SlotsLook], to: int) -> None:
    reshape = run(looks)[-1]
    assert reshape is not None and reshape.direction == "grow" and reshape.to_slots == to


@pytest.mark.parametrize("looks", [
    [SlotsLook(1, 1, 3), SlotsLook(1, 1, 3), SlotsLook(1, 1, 0), SlotsLook(1, 1, 3)],  # the queue emptied: run broken
    [SlotsLook(2, 1, 3)] * 5,  # a slot free while requests queue (a session waits for its own): no pressure
    [SlotsLook(8, 8, 9)] * 5,  # at the cap already
    [SlotsLook(1, 1, 2)] * 2,  # not yet grow_after looks
])
def test_no_grow(looks: list[SlotsLook]) -> None:
    assert run(looks) == [None] * len(looks)


def test_sustained_quiet_shrinks_back_to_the_base_shape() -> None:
    got = run([SlotsLook(8, 0, 0), SlotsLook(8, 1, 0), SlotsLook(8, 0, 0), SlotsLook(8, 1, 0)], base=1)
    assert got == [None, None, None, Reshape("shrink", 8, 1, 4, 1)]


@pytest.mark.parametrize(("looks", "base"), [
    ([SlotsLook(8, 2, 0)] * 6, 1),  # more busy than the base shape has: its own shape serves it
    ([SlotsLook(8, 0, 0)] * 3 + [SlotsLook(8, 8, 2)] + [SlotsLook(8, 0, 0)] * 3, 1),  # a burst breaks the run
    ([SlotsLook(2, 0, 0)] * 6, 2),  # never grew: nothing to give back
])
def test_no_shrink(looks: list[SlotsLook], base: int) -> None:
    assert [r for r in run(looks, base=base) if r is not None and r.direction == "shrink"] == []


def test_a_reshape_starts_the_count_again() -> None:
    state, reshape = SlotsState(), None
    for _ in range(3):
        state, reshape = decide_slots(state, SlotsLook(1, 1, 4), RULE, 1)
    assert reshape is not None and state == SlotsState()
