"""The supervisor's pure deciders, as tables: given candidates and needs, expect victims; given idle instances,
expect evictions and the next wake-up; given crash times, expect the circuit."""

from __future__ import annotations

import pytest

from blazar.instances.decide import (
    DEFAULT_RELOAD_S,
    Candidate,
    IdleView,
    decide_circuit,
    decide_idle,
    decide_victims,
    next_wakeup,
)

GiB = 1 << 30


def cand(iid: str, nbytes: int = GiB, *, idle_s: float = 0.0, in_flight: int = 0, pinned: bool = False,
         keep_alive_s: float | None = 300.0, load_ms: int | None = 2000, model: str | None = None) -> Candidate:
    return Candidate(instance_id=iid, model=model or f"m-{iid}", bytes=nbytes, idle_s=idle_s, in_flight=in_flight,
                     pinned=pinned, keep_alive_s=keep_alive_s, load_ms=load_ms)


def victims(cands: list[Candidate], *, need_bytes: int = 0, free_bytes: int = 0,
            need_count: int = 0) -> list[str] | None:
    v = decide_victims(cands, need_bytes=need_bytes, free_bytes=free_bytes, need_count=need_count)
    return None if v is None else v.ids


# -- decide_victims -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cands", "need_count", "want"), [
    # The least recently used goes when reload costs are equal.
    ([cand("a", idle_s=10), cand("b", idle_s=600), cand("c", idle_s=60)], 1, ["b"]),
    # A fast reload makes a recently used one cheaper to lose than a slow one idle a little longer.
    ([cand("slow", idle_s=100, load_ms=60_000), cand("fast", idle_s=10, load_ms=500)], 1, ["fast"]),
    # Unknown load time counts as DEFAULT_RELOAD_S.
    ([cand("known", idle_s=0, load_ms=int(DEFAULT_RELOAD_S * 1000) + 1), cand("unknown", idle_s=0, load_ms=None)],
     1, ["unknown"]),
    # Two over the limit: the two cheapest.
    ([cand("a", idle_s=1), cand("b", idle_s=500), cand("c", idle_s=50)], 2, ["b", "c"]),
    # Keep-alive forever goes last, even when it is the longest idle...
    ([cand("forever", idle_s=10_000, keep_alive_s=None), cand("recent", idle_s=1)], 1, ["recent"]),
    # ...but it does go when nothing else can.
    ([cand("forever", keep_alive_s=None), cand("busy", in_flight=2)], 1, ["forever"]),
    # Equal scores: a deterministic order by id.
    ([cand("b"), cand("a"), cand("c")], 1, ["a"]),
])
def test_max_loaded_models_evicts_the_cheapest_to_lose(cands: list[Candidate], need_count: int,
                                                       want: list[str]) -> None:
    assert victims(cands, need_count=need_count) == want


def test_a_memory_need_prefers_the_single_victim_that_suffices_over_two() -> None:
    cands = [cand("small1", 2 * GiB, idle_s=900), cand("small2", 2 * GiB, idle_s=800), cand("big", 5 * GiB, idle_s=5)]
    v = decide_victims(cands, need_bytes=8 * GiB, free_bytes=4 * GiB, need_count=0)
    assert v is not None and v.ids == ["big"] and v.bytes_freed == 5 * GiB and v.shortfall_bytes == 4 * GiB


def test_a_memory_need_takes_the_cheapest_single_among_several_that_suffice() -> None:
    cands = [cand("a", 6 * GiB, idle_s=5), cand("b", 4 * GiB, idle_s=500), cand("c", GiB, idle_s=5000)]
    assert victims(cands, need_bytes=3 * GiB) == ["b"]


def test_among_equally_cheap_ones_the_larger_goes_first_for_bytes() -> None:
    cands = [cand("a", GiB), cand("b", 3 * GiB), cand("c", 2 * GiB)]
    assert victims(cands, need_bytes=GiB) == ["b"]  # every one suffices alone: the larger of equals
    assert victims(cands, need_bytes=4 * GiB) == ["b", "c"]  # greedy by size among equals; a is not reached
    assert victims(cands, need_bytes=6 * GiB) == ["b", "c", "a"]


def test_no_more_than_needed_when_a_late_large_pick_makes_earlier_ones_redundant() -> None:
    cands = [cand("a", GiB, idle_s=900), cand("b", GiB, idle_s=800), cand("big", 10 * GiB, idle_s=1)]
    # Two must go for the count and 10 GiB for memory: big plus the single cheapest other one.
    assert victims(cands, need_bytes=10 * GiB, need_count=2) == ["a", "big"]


def test_busy_and_pinned_are_never_chosen_and_are_named_in_the_reason() -> None:
    cands = [cand("busy", 8 * GiB, idle_s=0, in_flight=1), cand("pin", 8 * GiB, idle_s=9000, pinned=True),
             cand("ok", 3 * GiB, idle_s=1)]
    v = decide_victims(cands, need_bytes=2 * GiB, free_bytes=0, need_count=1)
    assert v is not None and v.ids == ["ok"]
    assert v.excluded == {"busy": "busy", "pin": "pinned"}
    assert set(v.scores) == {"ok"}
    assert "busy (busy)" in v.why and "pin (pinned)" in v.why and "evict ok" in v.why and "\n" not in v.why


@pytest.mark.parametrize(("cands", "need_bytes", "need_count"), [
    ([cand("busy", 8 * GiB, in_flight=1), cand("pin", 8 * GiB, pinned=True)], GiB, 0),  # all protected
    ([cand("a", GiB), cand("b", GiB)], 3 * GiB, 0),  # all of them together are not enough
    ([cand("a"), cand("busy", in_flight=1)], 0, 2),  # cannot evict two
    ([], GiB, 0),
])
def test_none_when_no_allowed_set_is_enough(cands: list[Candidate], need_bytes: int, need_count: int) -> None:
    assert decide_victims(cands, need_bytes=need_bytes, free_bytes=0, need_count=need_count) is None


def test_nothing_to_evict_when_it_fits_and_the_count_allows() -> None:
    v = decide_victims([cand("a")], need_bytes=GiB, free_bytes=2 * GiB, need_count=0)
    assert v is not None and v.victims == () and v.bytes_freed == 0 and v.why.startswith("nothing to evict")


def test_finite_keep_alive_instances_are_tried_before_any_forever_one() -> None:
    cands = [cand("f", 10 * GiB, keep_alive_s=None, idle_s=9999), cand("a", 2 * GiB), cand("b", 2 * GiB)]
    assert victims(cands, need_bytes=3 * GiB) == ["a", "b"]  # two finite ones rather than the forever one
    assert victims(cands, need_bytes=5 * GiB) == ["f"]  # the finite ones are not enough: the forever one alone


def test_scores_are_reload_seconds_over_one_plus_idle_seconds() -> None:
    v = decide_victims([cand("a", idle_s=9, load_ms=3000), cand("b", idle_s=0, load_ms=None)],
                       need_bytes=0, free_bytes=0, need_count=1)
    assert v is not None and v.scores == {"a": 0.3, "b": DEFAULT_RELOAD_S}
    assert v.ids == ["a"]


def test_the_same_candidates_in_any_order_give_the_same_victims() -> None:
    cands = [cand(c, (i % 3 + 1) * GiB, idle_s=float(i % 2)) for i, c in enumerate("abcdefg")]
    want = victims(cands, need_bytes=5 * GiB, need_count=2)
    assert want is not None
    assert victims(list(reversed(cands)), need_bytes=5 * GiB, need_count=2) == want
    assert victims(cands[3:] + cands[:3], need_bytes=5 * GiB, need_count=2) == want


# -- decide_idle and next_wakeup -----------------------------------------------------------------------------


def idle(iid: str, idle_s: float, keep_alive_s: float | None = 300.0, *, in_flight: int = 0,
         pinned: bool = False) -> IdleView:
    return IdleView(instance_id=iid, idle_s=idle_s, in_flight=in_flight, pinned=pinned, keep_alive_s=keep_alive_s)


def test_idle_evicts_those_past_their_keep_alive_longest_overdue_first() -> None:
    views = [idle("fresh", 10), idle("due", 300), idle("overdue", 400), idle("zero", 0, keep_alive_s=0),
             idle("busy", 1000, in_flight=1), idle("pinned", 1000, pinned=True), idle("forever", 1e6, None)]
    assert decide_idle(views, 5000.0) == [("overdue", 400), ("due", 300), ("zero", 0)]


def test_next_wakeup_is_the_soonest_keep_alive_expiry_among_idle_ones() -> None:
    views = [idle("a", 10, 300), idle("b", 100, 120), idle("busy", 0, 5, in_flight=1), idle("forever", 0, None),
             idle("pinned", 0, 1, pinned=True)]
    assert next_wakeup(views, 5000.0) == 20.0
    assert next_wakeup([idle("late", 500, 300)], 5000.0) == 0.0
    assert next_wakeup([idle("busy", 0, 5, in_flight=1), idle("forever", 0, None)], 5000.0) is None
    assert next_wakeup([], 5000.0) is None


# -- decide_circuit ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("crashes", "now", "want"), [
    ([100.0, 110.0, 120.0], 120.0, True),  # three within 60 s
    ([100.0, 110.0, 120.0], 160.0, True),  # the oldest is exactly at the window's edge: still counts
    ([100.0, 110.0, 120.0], 160.1, False),  # it has left the window
    ([110.0, 120.0], 120.0, False),
    ([], 0.0, False),
    ([10.0, 110.0, 115.0, 120.0], 120.0, True),
])
def test_circuit_opens_at_limit_crashes_within_the_window(crashes: list[float], now: float, want: bool) -> None:
    assert decide_circuit(crashes, now, limit=3, window_s=60.0) is want


def test_a_crash_stamped_after_now_counts_as_recent() -> None:
    assert decide_circuit([119.0, 120.0, 121.0], 120.0, limit=3, window_s=60.0)
