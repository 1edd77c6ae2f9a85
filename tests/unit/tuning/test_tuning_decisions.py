"""blazar tune's pure decisions: the candidate postures, the guards' verdicts and the adoption rule (tables)."""

from __future__ import annotations

import pytest

from blazar.events.tuning import Posture
from blazar.tuning.candidates import candidate_postures, parse_only, thread_counts
from blazar.tuning.guards import Scored, drift_verdict, guard_kind, identity_verdict
from blazar.tuning.rule import Standing, decide, prune, ratios


def test_parse_only() -> None:
    assert parse_only(None) == ("spec", "kv", "threads", "batch", "slots")
    assert parse_only("kv, spec") == ("spec", "kv")
    with pytest.raises(ValueError, match="unknown --only gpu"):
        parse_only("spec,gpu")


@pytest.mark.parametrize(("cores", "want"), [(1, (1,)), (2, (2, 1)), (8, (8, 7, 1))])
def test_thread_counts(cores: int, want: tuple[int, ...]) -> None:
    assert thread_counts(cores) == want


def test_candidates_spec_only() -> None:
    got = candidate_postures(families=["spec"], ngram_types=("ngram-simple", "ngram-mod"), drafts=["small"],
                             cores=4, slots=[1, 2])
    assert got == [Posture(spec_type="ngram-simple"), Posture(spec_type="ngram-mod"),
                   Posture(spec_type="draft-simple", draft_model="small")]



def test_at_most_four_draft_models_are_tried() -> None:
    # A tune's verdicts are one event (profile.adopted): a store of many same-tokenizer models does not grow it.
    got = candidate_postures(families=["spec"], ngram_types=(), drafts=[f"d{i}" for i in range(9)], cores=4, slots=[1])
    assert [p.draft_model for p in got] == ["d0", "d1", "d2", "d3"]


def test_candidates_kv_quantised_v_only_with_flash_attention() -> None:
    got = candidate_postures(families=["kv"], ngram_types=(), drafts=[], cores=4, slots=[1])
    assert Posture() not in got
    assert Posture(flash_attn=False) in got
    for p in got:
        if p.cache_type_v not in (None, "f16"):
            assert p.flash_attn is True
    assert Posture(cache_type_k="q4_0", cache_type_v="q4_0", flash_attn=True) in got
    assert Posture(cache_type_k="q8_0", cache_type_v="f16", flash_attn=False) in got
    assert len(got) == 5


def test_candidates_all_families_are_distinct_single_changes() -> None:
    got = candidate_postures(families=["spec", "kv", "threads", "batch", "slots"], ngram_types=("ngram-simple",),
                             drafts=[], cores=2, slots=[1, 2, 4])
    assert len(got) == len(set(got)) == 1 + 5 + 2 + 2 + 3
    assert all(not p.is_default() for p in got)


@pytest.mark.parametrize(("posture", "kind"), [
    (Posture(spec_type="ngram-simple"), "identity"), (Posture(threads=1), "identity"), (Posture(slots=2), "identity"),
    (Posture(cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True), "drift"),
    (Posture(flash_attn=False), "drift"),
])
def test_guard_kind(posture: Posture, kind: str) -> None:
    assert guard_kind(posture) == kind


def test_identity_verdict() -> None:
    assert identity_verdict([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]).passed
    bad = identity_verdict([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]])
    assert not bad.passed and "prompt 2 at token 2 of 2" in bad.detail
    short = identity_verdict([[1, 2, 3]], [[1, 2]])
    assert not short.passed and "token 3" in short.detail


def _s(top1: int, lp: float | None) -> Scored:
    return Scored(top1=top1, ref_logprob=lp, floor_logprob=-9.0)


@pytest.mark.parametrize(("cand", "passed"), [
    ([_s(1, -0.5), _s(2, -0.5), _s(3, -0.5), _s(4, -0.5)], True),  # identical
    ([_s(1, -0.55), _s(2, -0.55), _s(3, -0.55), _s(4, -0.55)], True),  # drift 0.05
    ([_s(1, -0.7), _s(2, -0.7), _s(3, -0.7), _s(4, -0.7)], False),  # drift 0.2
    ([_s(1, -0.5), _s(9, -0.5), _s(3, -0.5), _s(4, -0.5)], False),  # agreement 0.75
    ([_s(1, -0.5), _s(2, -0.5), _s(3, -0.5), _s(4, None)], False),  # reference token off the list: floor -9
])
def test_drift_verdict(cand: list[Scored], passed: bool) -> None:
    ref = [1, 2, 3, 4]
    base = [_s(t, -0.5) for t in ref]
    assert drift_verdict(ref, base, cand).passed is passed


BASE = {"chat": 10.0, "code": 10.0}


@pytest.mark.parametrize(("cands", "winner"), [
    ([Standing("a", {"chat": 10.1, "code": 10.2})], None),  # within noise: the defaults stay
    ([Standing("a", {"chat": 9.0, "code": 20.0})], None),  # chat below 0.97x
    ([Standing("a", {"chat": 10.0, "code": 20.0})], "a"),
    ([Standing("a", {"chat": 10.0, "code": 20.0}, guard_passed=False)], None),
    ([Standing("a", {"chat": 10.0, "code": 14.0}), Standing("b", {"chat": 10.0, "code": 20.0})], "b"),
    ([Standing("a", {"chat": 10.0, "code": 20.0}), Standing("b", {"chat": 10.0, "code": 20.0})], "a"),  # tie
    ([Standing("a", {"chat": 30.0})], None),  # a workload not measured
])
def test_rule(cands: list[Standing], winner: str | None) -> None:
    d = decide(BASE, cands)
    assert d.winner == winner
    assert set(d.reasons) == {c.label for c in cands} - ({winner} if winner else set())
    assert "defaults" in d.summary


def test_rule_reasons_name_the_numbers() -> None:
    d = decide(BASE, [Standing("a", {"chat": 9.0, "code": 20.0}), Standing("b", {"chat": 10, "code": 14}),
                      Standing("c", {"chat": 10, "code": 20})])
    assert d.winner == "c"
    assert d.reasons["a"] == "chat at 0.90x the defaults (< 0.97)"
    assert "below c's 15.0" in d.reasons["b"]
    assert "c at 15.0 t/s = 1.50x the defaults' 10.0 (lowest workload 1.00x)" in d.summary


def test_prune_and_ratios() -> None:
    assert prune(BASE, {"chat": 8.0, "code": 8.0}) is not None
    assert prune(BASE, {"chat": 9.0, "code": 9.0}) is None
    assert ratios(BASE, {"chat": 5.0, "code": 20.0}) == {"chat": 0.5, "code": 2.0}
