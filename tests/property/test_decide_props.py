"""Properties of the eviction and idle deciders over random instances: victims free at least what is needed,
never include a busy or pinned instance, are minimal, exist whenever any allowed set would do, and do not depend
on the order the candidates came in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.instances.decide import Candidate, IdleView, decide_idle, decide_victims, next_wakeup

MiB = 1 << 20
PROPERTY = settings(max_examples=300, deadline=None)


@st.composite
def _candidates(draw: st.DrawFn) -> list[Candidate]:
    n = draw(st.integers(0, 8))
    return [
        Candidate(
            instance_id=f"i{k}",
            model=draw(st.sampled_from(["qwen", "gemma", "llama"])),
            # Few distinct sizes and idle times: ties are where ordering bugs hide.
            bytes=draw(st.sampled_from([0, 1, 2, 3, 5, 8])) * 512 * MiB,
            idle_s=draw(st.sampled_from([0.0, 1.0, 30.0, 600.0])),
            in_flight=draw(st.sampled_from([0, 0, 0, 1, 3])),
            pinned=draw(st.booleans().map(lambda b: b and draw(st.booleans()))),
            keep_alive_s=draw(st.sampled_from([None, 0.0, 300.0, 3600.0])),
            load_ms=draw(st.sampled_from([None, 200, 5000, 60_000])),
        )
        for k in range(n)
    ]


_need = st.tuples(st.integers(0, 24).map(lambda n: n * 256 * MiB), st.integers(0, 8).map(lambda n: n * 512 * MiB),
                  st.integers(0, 4))


def _meets(chosen: list[Candidate], shortfall: int, count: int) -> bool:
    return len(chosen) >= count and sum(c.bytes for c in chosen) >= shortfall


@PROPERTY
@given(cands=_candidates(), need=_need, data=st.data())
def test_victims_cover_the_need_exclude_busy_and_pinned_and_are_minimal(
    cands: list[Candidate], need: tuple[int, int, int], data: st.DataObject
) -> None:
    need_bytes, free_bytes, need_count = need
    shortfall = max(0, need_bytes - free_bytes)
    allowed = [c for c in cands if c.in_flight == 0 and not c.pinned]
    v = decide_victims(cands, need_bytes=need_bytes, free_bytes=free_bytes, need_count=need_count)

    if v is None:  # refused only when even every allowed instance together would not make room
        assert not _meets(allowed, shortfall, need_count)
        return
    chosen = list(v.victims)
    assert _meets(chosen, shortfall, need_count)
    assert all(c.in_flight == 0 and not c.pinned for c in chosen)
    assert len({c.instance_id for c in chosen}) == len(chosen)
    for c in chosen:  # minimal: none of them could have stayed
        assert not _meets([x for x in chosen if x is not c], shortfall, need_count)
    if shortfall == 0 and need_count == 0:
        assert chosen == []
    assert set(v.scores) == {c.instance_id for c in allowed}
    assert set(v.excluded) == {c.instance_id for c in cands} - set(v.scores)

    # Keep-alive forever ones go only when the others alone cannot make room.
    finite = [c for c in allowed if c.keep_alive_s is not None]
    if any(c.keep_alive_s is None for c in chosen):
        assert not _meets(finite, shortfall, need_count)
    # One victim whenever one is enough.
    if (shortfall or need_count) and need_count <= 1 and any(c.bytes >= shortfall for c in finite):
        assert len(chosen) == 1

    shuffled = data.draw(st.permutations(cands), label="the same candidates, reordered")
    again = decide_victims(shuffled, need_bytes=need_bytes, free_bytes=free_bytes, need_count=need_count)
    assert again is not None and again.ids == v.ids and again.scores == v.scores


_idle = st.builds(
    IdleView,
    instance_id=st.integers(0, 50).map(lambda n: f"i{n}"),
    idle_s=st.floats(0, 10_000, allow_nan=False),
    in_flight=st.sampled_from([0, 0, 1]),
    pinned=st.booleans(),
    keep_alive_s=st.one_of(st.none(), st.floats(0, 5_000, allow_nan=False)),
)


@PROPERTY
@given(views=st.lists(_idle, max_size=10, unique_by=lambda v: v.instance_id))
def test_idle_evicts_exactly_the_expired_and_wakes_for_the_next_expiry(views: list[IdleView]) -> None:
    now = 1_000_000.0
    due = dict(decide_idle(views, now))
    for v in views:
        reapable = v.in_flight == 0 and not v.pinned and v.keep_alive_s is not None
        expired = reapable and v.keep_alive_s is not None and v.idle_s >= v.keep_alive_s
        assert (v.instance_id in due) is expired
        if expired:
            assert due[v.instance_id] == v.idle_s
    remaining = [v for v in views if v.instance_id not in due]
    wake = next_wakeup(remaining, now)
    waits = [v.keep_alive_s - v.idle_s for v in remaining
             if v.in_flight == 0 and not v.pinned and v.keep_alive_s is not None]
    if not waits:
        assert wake is None
    else:
        assert wake is not None and wake == min(waits) and wake > 0  # the expired ones were all evicted
